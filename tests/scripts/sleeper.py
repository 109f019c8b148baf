"""Test job: print a line every interval for a long time (a job to stop, follow or interrupt)."""

import os
import sys
import time

interval = float(sys.argv[1]) if len(sys.argv) > 1 else 0.5
for i in range(100000):
    print(f"tick {i} rank {os.environ.get('RANK')}", flush=True)
    time.sleep(interval)
