"""Test job (gloo): a plain loop over a DataLoader with worker processes (which carry the rank's RANK and
LOCAL_RANK), an optimizer and DDP, printing no step lines. At step 5 one rank sleeps for 10 minutes while the
others wait in the gradient all-reduce. argv: the rank that sleeps (-1: none), steps (default 200)."""

import sys
import time

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset

late = int(sys.argv[1])
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 200
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
data = TensorDataset(torch.randn(8 * steps, 16), torch.randn(8 * steps, 1))
loader = DataLoader(data, batch_size=8, num_workers=2, persistent_workers=True)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step, (x, y) in enumerate(loader):
    if step == 5 and rank == late:
        time.sleep(600)  # the others wait for this rank in backward (DDP's gradient all-reduce)
    loss = torch.nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    time.sleep(0.05)
print(f"done rank {rank}", flush=True)
dist.destroy_process_group()
