"""GPU jobs for the device check (nccl): each rank on cuda:LOCAL_RANK in DDP, an optimizer step a step (the hook
counts them). argv: mode, the process group's timeout in seconds.

- `item`: `step N` lines; at step 5 rank 1 sleeps 600 s; rank 0 goes on to its next step's backward and
  loss.item() (a CUDA synchronisation behind the all-reduce rank 1 never enters).
- `barrier`: as `item`, but rank 0 blocks in dist.barrier(device_ids) at step 5 (inside the collective).
- `slow`: no hang; rank 1 sleeps 0.1 s before each forward (the straggler), 300 steps, a line every 50.
- `save`: no hang; at step 5 rank 0 spins its CPU for 60 s, silent (a checkpoint's write) while rank 1 waits in
  loss.item() behind the all-reduce; then both go on for 20 steps.
FR_PROBE_DIR (environment): at step 3 each rank writes what torch's recorders say in-process there
(`_dump_nccl_trace`, `_dump_fr_trace`, pickled and as JSON where torch has it), the test data of the collectives.
"""

import datetime
import os
import pickle
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


def probe(folder: str) -> None:
    """Each recorder's in-process dump, as it is, into `folder` (any failure written down instead)."""
    from torch._C import _distributed_c10d as c10d

    os.makedirs(folder, exist_ok=True)
    for name, args in (("_dump_nccl_trace", (True, False, False)), ("_dump_fr_trace", (True, False, False)),
                       ("_dump_nccl_trace_json", (True, False)), ("_dump_fr_trace_json", (True, False))):
        began = time.monotonic()
        try:
            data = getattr(c10d, name)(*args)
            took = time.monotonic() - began
            if isinstance(data, (bytes, bytearray)) and not name.endswith("json"):
                data = repr(pickle.loads(data)).encode()
            with open(os.path.join(folder, f"rank{rank}{name}.txt"), "wb") as out:
                out.write(data if isinstance(data, (bytes, bytearray)) else str(data).encode())
            print(f"probe {name}: {len(data)} bytes in {took * 1000:.2f} ms", flush=True)
        except Exception as error:  # what this torch lacks is the finding
            print(f"probe {name}: {type(error).__name__}: {error}", flush=True)


steps = {"slow": 300, "save": 26}.get(mode, 1000)
for step in range(steps):
    if step == 3 and os.environ.get("FR_PROBE_DIR"):
        probe(os.environ["FR_PROBE_DIR"])
    if mode in ("item", "barrier") and step == 5 and rank == 1:
        time.sleep(600)
    if mode == "barrier" and step == 5:
        dist.barrier(device_ids=[local])
    if mode == "save" and step == 5 and rank == 0:
        end = time.monotonic() + 60
        while time.monotonic() < end:
            pass
    if mode == "slow" and rank == 1:
        time.sleep(0.1)
    loss = model(x).square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    if mode != "slow" or step % 50 == 0:
        print(f"step {step} loss {loss.item():.4f}", flush=True)
    time.sleep(0.2 if mode in ("item", "barrier") else 0.02)
torch.cuda.synchronize()  # the steps' collectives done before the peer may leave (it enqueues ahead of us)
dist.destroy_process_group()
print(f"done rank {rank}", flush=True)
