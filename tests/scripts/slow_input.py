"""Test job: every rank trains alone (no process group), a tiny model, SGD, a DataLoader in the process, each step's
compute 50 ms; the rank named `slow` waits `wait` seconds more for each batch (a slow input: its dataset reads
slowly), so its rate falls and its data share rises. It prints no step line: its progress is the hook's record.
argv: slow rank, seconds each of its batches waits, seconds to run."""

import os
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset

slow, wait, seconds = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
rank = int(os.environ["RANK"])


class Samples(Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, index):
        if rank == slow:
            time.sleep(wait)  # the slow input
        return torch.ones(4), torch.zeros(1)


model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loader = DataLoader(Samples(), batch_size=1)
end = time.monotonic() + seconds
while time.monotonic() < end:
    for x, y in loader:
        time.sleep(0.05)  # the step's compute
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if time.monotonic() >= end:
            break
