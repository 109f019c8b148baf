"""Test job (gloo): every rank prints `step N` a few times, then one rank sleeps before an all_reduce that the
others have already entered. argv: the rank that sleeps, its sleep in seconds, steps before it (default 2)."""

import sys
import time

import torch
import torch.distributed as dist

late, sleep_s = int(sys.argv[1]), float(sys.argv[2])
steps = int(sys.argv[3]) if len(sys.argv) > 3 else 2
dist.init_process_group("gloo")
rank = dist.get_rank()
x = torch.ones(4)
for step in range(steps):
    dist.all_reduce(x)
    print(f"step {step}", flush=True)
if rank == late:
    time.sleep(sleep_s)  # the odd one out: every other rank already waits in the all_reduce below
dist.all_reduce(x)
print(f"done {rank}", flush=True)
dist.destroy_process_group()
