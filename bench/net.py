"""Figures of `inv doctor --net` (python -m bench.net [--sizes 2,8,16] [--repeat N]): its time as a user types it
(a fresh process: the doctor's checks, then one rank a node under torchrun, the measurement, the answer), and the
group's all_reduce bandwidth it reports against a plain torch.distributed all_reduce loop of the same size, run by
hand over an ssh loop on the same nodes in the same run (bench/workloads/allreduce_loop.py). Results:
bench/results/net.json.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import statistics
import sys
from pathlib import Path

from bench.baselines import ssh_loop
from bench.common import REPO, free_port, log, run_alone, run_timed, sandbox_of

LOOP = "bench/workloads/allreduce_loop.py"
RUNS = 5


def doctor_net(inventory: Path, root: Path) -> dict:
    result = run_timed([sys.executable, "-m", "invoke", "doctor", "--hosts", str(inventory), "--net", "--json"],
                       timeout=600, env={"INVOKE_LAUNCHER_LOG_DIR": str(root / "logs")})
    report = json.loads(result.stdout)
    group = report.get("net") or {}
    if result.code != 0 or "busbw_gbps" not in group:
        raise RuntimeError(f"inv doctor --net failed (exit {result.code}): {result.stdout[-1500:]}")
    return {"seconds": round(result.seconds, 2), "busbw_gbps": group["busbw_gbps"], "at_bytes": group["at_bytes"]}


def by_hand(box, nbytes: int) -> float:
    port = free_port()
    commands = [f"cd {shlex.quote(str(REPO))} && {box.tmp_words}" + shlex.join([
        box.python, "-m", "torch.distributed.run", "--nnodes", str(box.n), "--node-rank", str(i), "--nproc-per-node",
        "1", "--master-addr", "node-0", "--master-port", str(port), LOOP, str(nbytes), str(RUNS)])
        for i in range(box.n)]
    result = ssh_loop(box.ssh_config, commands, timeout=600)
    found = re.search(r"ALLREDUCE busbw_gbps=([\d.]+)", result.stdout)
    if result.code != 0 or not found:
        text = result.stdout + result.stderr
        raise RuntimeError(f"the all_reduce loop failed (exit {result.code}): {text[-1500:]}")
    return float(found.group(1))


def run(sizes: list[int], repeat: int, root: Path) -> dict:
    rows = []
    for n in sizes:
        with sandbox_of(n, root) as box:
            doctor, hand = [], []
            for _ in range(repeat):
                doctor.append(doctor_net(box.inventory, root))
                hand.append(by_hand(box, doctor[-1]["at_bytes"]))
        row = {"nodes": n, "doctor_s": [d["seconds"] for d in doctor],
               "doctor_gbps": [d["busbw_gbps"] for d in doctor], "at_bytes": doctor[-1]["at_bytes"],
               "by_hand_gbps": hand,
               "ratio": round(statistics.median(d["busbw_gbps"] for d in doctor) / statistics.median(hand), 3)}
        log(f"doctor --net n={n}: {row['doctor_s']} s, {row['doctor_gbps']} Gbit/s at {row['at_bytes']} B; "
            f"by hand {hand} Gbit/s; ratio {row['ratio']}")
        rows.append(row)
    return {"rows": rows}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="2,8,16")
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    return run_alone("net", lambda root: run([int(x) for x in args.sizes.split(",")], args.repeat, root))


if __name__ == "__main__":
    sys.exit(main())
