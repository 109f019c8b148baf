"""The baseline of `inv doctor --net`'s bandwidth: a plain torch.distributed all_reduce loop, as one would run it by
hand under torchrun on every node. argv: bytes, runs. Rank 0 prints `ALLREDUCE busbw_gbps=X time_s=Y`."""

import sys
import time

import torch
import torch.distributed as dist

nbytes, runs = int(sys.argv[1]), int(sys.argv[2])
dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
world = dist.get_world_size()
tensor = torch.ones(nbytes // 4, dtype=torch.float32, device="cuda" if torch.cuda.is_available() else "cpu")
dist.all_reduce(tensor)
dist.barrier()
start = time.perf_counter()
for _ in range(runs):
    dist.all_reduce(tensor)
if torch.cuda.is_available():
    torch.cuda.synchronize()
took = (time.perf_counter() - start) / runs
if dist.get_rank() == 0:
    print(f"ALLREDUCE busbw_gbps={2 * (world - 1) / world * nbytes * 8 / took / 1e9:.3f} time_s={took:.4f}", flush=True)
dist.destroy_process_group()
