"""Test job: print `lines` lines of `width` characters at `rate` lines/s, or (`--no-newline BYTES`) one long line."""

import os
import sys
import time

if sys.argv[1] == "--no-newline":
    total, piece = int(sys.argv[2]), b"x" * 65536
    for _ in range(total // len(piece)):
        sys.stdout.buffer.write(piece)
    sys.stdout.buffer.flush()
    sys.exit(0)
lines, rate, width = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
rank = os.environ.get("RANK")
for i in range(lines):
    text = f"line {i} rank {rank} "
    print(text + "." * max(0, width - len(text)), flush=True)
    time.sleep(1 / rate)
