"""Test job (gloo): a hang that keeps every CPU busy, as a hung NCCL collective does on a GPU node. No optimizer, no
DataLoader: only `step N` lines. Every rank runs a thread that busy-polls (as NCCL's proxy thread does) and, a
stand-in for torch's monitor thread (no NCCL here), reads the flight recorder's debug-info pipe it made where torch
would (`<run dir>/nccl/pipe_rank_<rank>.pipe`), writing `nccl_trace_rank_<rank>` when asked. At step 5 rank 1
sleeps for 10 minutes, while the others wait in the all_reduce."""

import os
import threading
import time

import torch
import torch.distributed as dist


def poll(folder, rank):
    """Spin, never sleeping; dump when something came through the pipe. At the lowest priority (this thread's): it
    keeps a CPU busy that nothing else wants, and yields to the tests beside it (the CPU it takes is not the point)."""
    os.nice(19)
    fd = os.open(os.path.join(folder, f"pipe_rank_{rank}.pipe"), os.O_RDONLY | os.O_NONBLOCK)
    spins = 0
    while True:
        spins += 1
        try:
            asked = os.read(fd, 128)
        except BlockingIOError:
            continue
        if asked:
            with open(os.path.join(folder, f"nccl_trace_rank_{rank}"), "wb") as dump:
                dump.write(b"flight recorder of rank %d, asked after %d spins" % (rank, spins))


dist.init_process_group("gloo")
rank = dist.get_rank()
nccl = os.path.join(os.path.dirname(os.environ["DDP_LAUNCHER_STACKS"].rpartition(":")[0]), "nccl")
os.makedirs(nccl, exist_ok=True)
os.mkfifo(os.path.join(nccl, f"pipe_rank_{rank}.pipe"))
threading.Thread(target=poll, args=(nccl, rank), daemon=True).start()
x = torch.ones(4)
for step in range(8):
    if step == 5 and rank == 1:
        time.sleep(600)  # the odd one out: the others already wait in the all_reduce below
    dist.all_reduce(x)
    print(f"step {step}", flush=True)
dist.destroy_process_group()
