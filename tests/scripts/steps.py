"""Test job: print `step N` every `period` seconds (the rank named `slow` takes `factor` times longer), with a
little work each step so the rank's CPU time grows. argv: period, slow rank, factor, seconds to run (default: an
hour)."""

import os
import sys
import time

period, slow, factor = float(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
seconds = float(sys.argv[4]) if len(sys.argv) > 4 else 3600.0
rank = int(os.environ["RANK"])
pace = period * (factor if rank == slow else 1.0)
end, step = time.monotonic() + seconds, 0
while time.monotonic() < end:
    sum(i * i for i in range(50000))  # a little CPU, as a real step has
    print(f"rank {rank} step {step}", flush=True)
    step += 1
    time.sleep(pace)
