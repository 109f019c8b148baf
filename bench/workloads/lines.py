"""Print COUNT short lines as fast as possible: `python bench/workloads/lines.py COUNT [--batch B]`.

Each line is `rank R line I` (R from $RANK, I = 0..COUNT-1). Lines are written B at a time (default 100) with one
write() and one flush() per batch, so that a line is never split across writes; --batch 1 flushes every line.
"""

import os
import sys


def main() -> int:
    count = int(sys.argv[1])
    batch = int(sys.argv[sys.argv.index("--batch") + 1]) if "--batch" in sys.argv else 100
    rank = os.environ.get("RANK", "0")
    out = sys.stdout
    prefix = f"rank {rank} line "
    for start in range(0, count, batch):
        out.write("".join(f"{prefix}{i}\n" for i in range(start, min(start + batch, count))))
        out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
