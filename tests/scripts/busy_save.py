"""Test job (gloo): a healthy run that is silent for longer than the hang timeout. Both ranks step; then rank 0
writes a checkpoint, busy and silent for argv[1] seconds, while rank 1 first waits on a slow write of its own (a
sleep, in no collective) for argv[2] seconds and then in the barrier that ends the save; then both step on."""

import os
import sys
import time

import torch
import torch.distributed as dist


def save_checkpoint(seconds):
    """Busy and silent, as torch.save of a large model is. At the lowest priority: it spins on whatever CPU the
    other tests beside it leave (its stack is the point, not its CPU seconds)."""
    os.nice(19)  # for the rest of the run: its three steps after the save are light
    end, total = time.monotonic() + seconds, 0
    while time.monotonic() < end:
        total += 1
    return total


def slow_write(seconds):
    time.sleep(seconds)


dist.init_process_group("gloo")
rank = dist.get_rank()
x = torch.ones(4)
for step in range(3):
    dist.all_reduce(x)
    print(f"step {step}", flush=True)
if rank == 0:
    save_checkpoint(float(sys.argv[1]))
else:
    slow_write(float(sys.argv[2]))
dist.barrier()
for step in range(3, 6):
    dist.all_reduce(x)
    print(f"step {step}", flush=True)
dist.destroy_process_group()
