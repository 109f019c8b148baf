"""Test job: what NCCL's watchdog leaves when a collective times out, without a GPU. Each rank writes a flight
recorder dump where the launcher points TORCH_NCCL_DEBUG_INFO_TEMP_FILE on GPU nodes (`<run dir>/nccl/`), says
what the watchdog says, and exits with an error: the run ends by itself."""

import os
import sys
import time

rank = os.environ["RANK"]
stacks = os.environ["DDP_LAUNCHER_STACKS"].rpartition(":")[0]  # <run dir>/stacks: the hook's folder
folder = os.path.join(os.path.dirname(stacks), "nccl")
os.makedirs(folder, exist_ok=True)
with open(os.path.join(folder, "nccl_trace_rank_" + rank), "wb") as dump:
    dump.write(b"flight recorder of rank " + rank.encode())
print(f"[Rank {rank}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7, OpType=ALLREDUCE) ran for "
      "600000 milliseconds before timing out.", flush=True)
time.sleep(0.5)
sys.exit(1)
