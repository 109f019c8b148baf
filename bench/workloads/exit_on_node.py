"""Bench job: the workers of node rank N (argv[1]) exit with code C (argv[2]) 0.5 s after they start; the others
wait (argv[3] s, default 120), as ranks blocked in a collective do: the failures figure's worker crash."""

import os
import sys
import time

node, code = int(sys.argv[1]), int(sys.argv[2])
if int(os.environ["GROUP_RANK"]) == node:
    print(f"rank {os.environ['RANK']} exiting with {code}", flush=True)
    time.sleep(0.5)
    sys.exit(code)
time.sleep(float(sys.argv[3]) if len(sys.argv) > 3 else 120)
