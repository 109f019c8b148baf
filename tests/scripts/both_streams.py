"""Test job: `count` numbered lines on stdout and on stderr, in batches of `batch` lines per write; every tenth
stdout line ends in `\\r\\n`; stdout ends with a line that has no newline."""

import os
import sys

count, batch = int(sys.argv[1]), int(sys.argv[2])
rank = os.environ["RANK"]
for start in range(0, count, batch):
    lines = range(start, min(start + batch, count))
    sys.stdout.write("".join(f"out {rank} {i}" + ("\r\n" if i % 10 == 0 else "\n") for i in lines))
    sys.stdout.flush()
    sys.stderr.write("".join(f"err {rank} {i}\n" for i in lines))
    sys.stderr.flush()
sys.stdout.write(f"last {rank}")
