"""Test job: every rank writes its argv, chosen env values and identity to <out_dir>/rank<R>.json."""

import json
import os
import socket
import sys

out_dir = os.environ["ECHO_OUT_DIR"]
record = {
    "argv": sys.argv[1:],
    "env": {k: v for k, v in os.environ.items() if k.startswith("ECHO_")},
    "rank": int(os.environ["RANK"]),
    "world": int(os.environ["WORLD_SIZE"]),
    "host": socket.gethostname(),
    "cwd": os.getcwd(),
}
with open(os.path.join(out_dir, f"rank{record['rank']}.json"), "w", encoding="utf-8") as f:
    json.dump(record, f)
print(f"echoed rank {record['rank']} of {record['world']} on {record['host']}", flush=True)
