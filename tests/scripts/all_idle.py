"""Test job: every rank prints `step N` for a few steps, then waits on nothing it shares with the others (a sleep, as
on a dead filesystem or a stuck data source): no collective, no progress, no CPU. argv: STEPS SECONDS."""

import os
import sys
import time

steps, seconds = int(sys.argv[1]), float(sys.argv[2])
for step in range(steps):
    print(f"step {step} rank {os.environ['RANK']}", flush=True)
    time.sleep(0.2)
time.sleep(seconds)
