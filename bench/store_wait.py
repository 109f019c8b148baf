"""What the store wait (launcher/node/agent/storewait.py) saves a start: `python -m bench.store_wait [PAIRS]`.

1. torch's own backoff: a `TCPStore` client that tries 20 ms before its server listens, and when it connects after
   the server came up (12 tries, in one process).
2. Two local torchruns started together (2 nodes of one rank, gloo), to the ranks' first barrier: node 1's torchrun
   as `-m torch.distributed.run` against the same words behind the wait, in pairs whose order alternates (default 10
   pairs). Prints the medians, the spreads and the ratio.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from devtools.observe import free_port
from launcher.limits import NODE_TIMING
from launcher.node.agent.storewait import waiting_argv

BACKOFF = """
import datetime, json, socket, threading, time
from torch.distributed import TCPStore
late = []
for _ in range(12):
    probe = socket.socket(); probe.bind(("127.0.0.1", 0)); port = probe.getsockname()[1]; probe.close()
    up = {}
    def serve():
        time.sleep(0.02)
        up["at"] = time.monotonic()
        up["store"] = TCPStore("127.0.0.1", port, 2, True, datetime.timedelta(seconds=30), wait_for_workers=False)
    thread = threading.Thread(target=serve); thread.start()
    TCPStore("127.0.0.1", port, 2, False, datetime.timedelta(seconds=30))
    late.append(time.monotonic() - up["at"])
    thread.join()
print(json.dumps(late))
"""

WORKER = """
import time, torch.distributed as dist
dist.init_process_group("gloo")
dist.barrier()
if dist.get_rank() == 0:
    print("READY", time.time(), flush=True)
dist.destroy_process_group()
"""


def start_to_barrier(worker: Path, wait: bool) -> float:
    """Seconds from starting both torchruns to rank 0 past the first barrier."""
    port = free_port()
    procs = []
    began = time.time()
    for rank in (0, 1):
        argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(rank),
                "--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--master-port", str(port), str(worker)]
        if wait:
            argv = waiting_argv(argv, {"node_rank": rank, "master_addr": "127.0.0.1", "master_port": port},
                                NODE_TIMING["store_wait_s"], NODE_TIMING["store_poll_s"])
        procs.append(subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    out, err = procs[0].communicate(timeout=120)
    procs[1].communicate(timeout=120)
    if any(p.returncode for p in procs) or "READY" not in out:
        raise RuntimeError(f"a torchrun failed: {err[-2000:]}")
    return float(out.split("READY", 1)[1].split()[0]) - began


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} s ({min(values):.2f}-{max(values):.2f})"


def main() -> int:
    pairs = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    late = json.loads(subprocess.run([sys.executable, "-c", BACKOFF], capture_output=True, text=True,
                                     check=True, timeout=120).stdout)
    print(f"torch's backoff: a client refused 20 ms early connected {_spread(late)} after its server came up")
    found: dict[bool, list[float]] = {False: [], True: []}
    with tempfile.TemporaryDirectory(prefix="store-wait-") as folder:
        worker = Path(folder) / "worker.py"
        worker.write_text(WORKER)
        for i in range(pairs):
            for wait in ((False, True) if i % 2 else (True, False)):
                found[wait].append(start_to_barrier(worker, wait))
    ratio = statistics.median(found[True]) / statistics.median(found[False])
    print(f"two torchruns to the first barrier, {pairs} pairs: with the wait {_spread(found[True])}, "
          f"without {_spread(found[False])}: {ratio:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
