"""Test job (gloo): a plain DDP training loop that prints no step line, as Lightning or HF Trainer into a file: a tiny
model, SGD, a DataLoader. Every rank's forward takes 20 ms; the rank named `slow` takes `extra` seconds more, so in
lockstep every rank has the same step rate and only its forward tells it apart. argv: steps, slow rank (-1: none),
extra seconds, DataLoader workers of local rank 0 (the others draw in the process), and `break-hook` to make the
launcher's hook fail as it patches torch (recording off; the job must run as without it), `fail` to make the slow
rank raise once its steps are done (the run's page shows its exception). Each rank ends with its loop's own rate:
`rank R finished N steps in T s (X steps/s)`."""

import os
import sys
import time

steps, slow, extra, workers = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
if "break-hook" in sys.argv[5:]:
    def broken(*args):
        raise RuntimeError("patching failed on purpose")

    sys.modules["_ddp_launcher_patches"].wrap_next = broken  # before torch is imported: its patching raises

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
mine = workers if int(os.environ["LOCAL_RANK"]) == 0 else 0
loader = DataLoader(TensorDataset(torch.randn(256, 16), torch.randn(256, 1)), batch_size=8, num_workers=mine,
                    persistent_workers=mine > 0)
done, began = 0, time.perf_counter()
while done < steps:
    for x, y in loader:
        time.sleep(0.02 + (extra if rank == slow else 0.0))  # the forward's own work
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()  # DDP's all_reduce: the others wait here for the slow rank
        opt.step()
        done += 1
        if done == steps:
            break
if "fail" in sys.argv[5:] and rank == slow:
    raise RuntimeError(f"rank {rank} fails on purpose after {done} steps")
took = time.perf_counter() - began  # its loop, as a training script times itself (its rate: the page's to match)
dist.destroy_process_group()
print(f"rank {rank} finished {done} steps in {took:.2f} s ({done / took:.2f} steps/s)", flush=True)
os._exit(0)  # no interpreter teardown under gloo's last threads: it can abort a good run (see train/ddp.py's end)
