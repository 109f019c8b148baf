"""Test job (gloo): a GPU node's hang as its host sees it, without a GPU. At step 5 rank 1 sleeps for 10 minutes. On
a GPU rank 0 would enqueue its all-reduce and wait behind it in `loss.item()` (a CUDA synchronisation, seen so on an
H100): here it blocks in C on that line, reading a pipe nobody writes. A thread stands for torch's monitor thread: it
reads the flight recorder's pipe (`<run dir>/nccl/pipe_rank_<rank>.pipe`) and, when asked, writes a dump in torch's
format (a pickle of pg_status and entries) of the collectives this rank enqueued and those that completed."""

import os
import pickle
import threading
import time

import torch
import torch.distributed as dist

count = {"enqueued": 0, "completed": 0}


def dump():
    entries = [{"collective_seq_id": seq, "state": "completed" if seq <= count["completed"] else "scheduled",
                "profiling_name": "nccl:all_reduce", "process_group": ("0", "default_pg"), "pg_id": 0,
                "is_p2p": False, "frames": []} for seq in range(1, count["enqueued"] + 1)]
    return pickle.dumps({"version": "2.10", "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}},
                         "pg_status": {"0": {"last_enqueued_collective": count["enqueued"],
                                             "last_started_collective": -1,
                                             "last_completed_collective": count["completed"]}},
                         "entries": entries}, protocol=2)


def monitor(folder, rank):
    pipe = os.path.join(folder, f"pipe_rank_{rank}.pipe")
    os.mkfifo(pipe)
    fd = os.open(pipe, os.O_RDONLY | os.O_NONBLOCK)
    while True:
        time.sleep(0.2)
        try:
            asked = os.read(fd, 128)
        except BlockingIOError:
            continue
        if asked:
            with open(os.path.join(folder, f"nccl_trace_rank_{rank}"), "wb") as out:
                out.write(dump())


dist.init_process_group("gloo")
rank = dist.get_rank()
nccl = os.path.join(os.path.dirname(os.environ["DDP_LAUNCHER_STACKS"].rpartition(":")[0]), "nccl")
os.makedirs(nccl, exist_ok=True)
threading.Thread(target=monitor, args=(nccl, rank), daemon=True).start()
stalled, _ = os.pipe()
loss = torch.ones(1)
for step in range(8):
    if step == 5 and rank == 1:
        time.sleep(600)  # the odd one out
    count["enqueued"] += 1
    if step == 5:  # rank 0 alone: its all-reduce would be on the GPU, and the host waits behind it
        print(f"step {step} loss {loss.item() + len(os.read(stalled, 1))}", flush=True)
    dist.all_reduce(loss)
    count["completed"] += 1
    print(f"step {step}", flush=True)
dist.destroy_process_group()
