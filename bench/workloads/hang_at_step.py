"""Test job (gloo): a training loop that checkpoints and hangs. Each step is an optimizer step on a tiny model and an
all_reduce; rank 0 saves a checkpoint every `every` steps; one rank sleeps for ever when it reaches step `at`, while
the others wait for it in the all_reduce: the first rank of the node named WHO, or with `rank:R` global rank R
(whichever node holds it: a bug of the program's, not of a node). The launcher's next attempt (DDP_LAUNCHER_ATTEMPT
above 1) goes on from the checkpoint. argv: CHECKPOINT TOTAL AT WHO EVERY and nothing else, as a plain script takes
its arguments (an argument added on a retry fails it); prints `step N`, `resumed from step N`, `rank R hangs before
step N` (a line naming a step no rank made) and `done rank R at step N`."""

import os
import socket
import sys
import time

import torch
import torch.distributed as dist

if len(sys.argv) != 6:
    sys.exit(f"usage: {sys.argv[0]} CHECKPOINT TOTAL AT WHO EVERY (got {sys.argv[1:]})")
path, total, at, who, every = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
dist.init_process_group("gloo")
rank = dist.get_rank()
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
step = 0
if int(os.environ.get("DDP_LAUNCHER_ATTEMPT", "1")) > 1 and os.path.exists(path):  # the launcher's next attempt
    saved = torch.load(path)
    model.load_state_dict(saved["model"])
    step = saved["step"]
    print(f"resumed from step {step}", flush=True)
if who.startswith("rank:"):
    hangs_here = rank == int(who[len("rank:"):])
else:
    hangs_here = who == socket.gethostname() and int(os.environ["LOCAL_RANK"]) == 0
while step < total:
    step += 1
    if step == at and hangs_here:
        print(f"rank {rank} hangs before step {step}", flush=True)  # a line that names a step not made
        while True:  # stuck for ever: the others wait for this rank in the all_reduce below
            time.sleep(3600)
    optimizer.zero_grad()
    model(torch.ones(8, 4)).sum().backward()
    optimizer.step()
    x = torch.ones(4)
    dist.all_reduce(x)
    print(f"step {step}", flush=True)
    if rank == 0 and step % every == 0:
        torch.save({"model": model.state_dict(), "step": step}, path + ".tmp")
        os.replace(path + ".tmp", path)
    time.sleep(0.05)
print(f"done rank {rank} at step {step}", flush=True)
dist.destroy_process_group()
