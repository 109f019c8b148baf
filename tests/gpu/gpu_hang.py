"""GPU hang (nccl): each rank on cuda:LOCAL_RANK in DDP, an optimizer step a step (the hook counts them), `step N`
lines; at step 5 rank 1 sleeps 600 s. Rank 0 goes on: `item` -> its next step's backward and loss.item() (a CUDA
synchronisation behind the hung all-reduce); `barrier` -> dist.barrier(device_ids) (blocks inside the collective).
argv: mode, the process group's timeout in seconds."""

import datetime
import os
import sys
import time

import torch
import torch.distributed as dist

mode, pg_timeout = sys.argv[1], float(sys.argv[2])
local = int(os.environ["LOCAL_RANK"])
dev = torch.device("cuda", local)
torch.cuda.set_device(dev)
dist.init_process_group("nccl", timeout=datetime.timedelta(seconds=pg_timeout), device_id=dev)
rank = dist.get_rank()
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(64, 64).to(dev), device_ids=[local])
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(32, 64, device=dev)
for step in range(1000):
    if step == 5 and rank == 1:
        time.sleep(600)
    if mode == "barrier" and step == 5:
        dist.barrier(device_ids=[local])
    loss = model(x).square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item():.4f}", flush=True)
    time.sleep(0.2)
