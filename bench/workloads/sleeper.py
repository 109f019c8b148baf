"""Bench job: print a line every interval (argv[1], default 0.5 s) for a long time: a job to stop or to break.

The bench's own, like the tests' sleeper they keep for themselves: a change to a test's job changes no figure.
"""

import os
import sys
import time

interval = float(sys.argv[1]) if len(sys.argv) > 1 else 0.5
for i in range(100000):
    print(f"tick {i} rank {os.environ.get('RANK')}", flush=True)
    time.sleep(interval)
