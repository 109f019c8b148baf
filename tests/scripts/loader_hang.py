"""Test job (gloo): a plain loop over a DataLoader with worker processes (which carry the rank's RANK and
LOCAL_RANK), an optimizer and DDP, printing no step lines. At step 5 one rank sleeps for 10 minutes while the
others wait in the gradient all-reduce. argv: the rank that sleeps (-1: none), steps (default 200), and where it
sleeps: `main` (default: its own loop) or `worker` (a DataLoader worker of that rank, in the dataset's `__getitem__`
for the first sample of step 5's batch: the rank waits for its workers, the others in the all-reduce)."""

import os
import sys
import time

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset

late = int(sys.argv[1])
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 200
where = sys.argv[3] if len(sys.argv) > 3 else "main"
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)


class Samples(TensorDataset):
    def __getitem__(self, index):
        if where == "worker" and index == 8 * 5 and int(os.environ["RANK"]) == late:
            time.sleep(600)  # in a worker process of the late rank (workers carry its RANK)
        return super().__getitem__(index)


data = Samples(torch.randn(8 * steps, 16), torch.randn(8 * steps, 1))
loader = DataLoader(data, batch_size=8, num_workers=2, persistent_workers=True)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step, (x, y) in enumerate(loader):
    if step == 5 and rank == late and where == "main":
        time.sleep(600)  # the others wait for this rank in backward (DDP's gradient all-reduce)
    loss = torch.nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    time.sleep(0.05)
print(f"done rank {rank}", flush=True)
dist.destroy_process_group()
