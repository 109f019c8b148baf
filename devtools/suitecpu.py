"""Where a command's CPU goes, every process of the machine counted (the test suite: `python -m devtools.suitecpu --
.venv/bin/python -m pytest -q`). `time` counts only the command's own descendants; the sandbox nodes' processes are
sshd's children, and on this 2-core machine they are most of the suite's CPU. Every process is sampled every
`--every` seconds (its CPU time and command line, re-read when its CPU grew: an sshd child becomes bash, then the
node's python); at the end the last-seen CPU of each is summed by kind. A process that lives less than one sample is
missed, so the figures are a floor. Prints the kinds and the heaviest command lines; `--json PATH` keeps the samples.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

KINDS = (
    ("torchrun", r"import torch\.d|torch\.distributed\.run|os\.chdir\(sys\.argv"),
    ("worker: a trainer", r"lightning_boring|hf_trainer"),
    ("worker: torch job", r"\.py\b.*(train/|tests/scripts/|gpu_hang|netjob)|doctor --net"),
    ("node program (agent, probe)", r"zlib\.decompress"),
    ("inv / ddpl", r"-m invoke|/inv |/ddpl "),
    ("pip", r"\bpip\b"),
    ("pytest", r"pytest|exec\(eval\(sys\.stdin"),
    ("sshd and ssh", r"sshd|^ssh "),
    ("SLURM", r"slurm|munge|srun|sbatch"),
    ("kernel threads and the unnamed", r"^$"),
)


def kind_of(command: str) -> str:
    return next((name for name, pattern in KINDS if re.search(pattern, command)), "other")


def _read(pid: str) -> tuple[tuple[int, int], float] | None:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            stat = handle.read()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(pid), int(fields[19])), (int(fields[11]) + int(fields[12])) / ticks


def _command(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read().replace(b"\0", b" ").decode(errors="replace").strip()[:300]
    except OSError:
        return ""


def snapshot() -> dict[tuple[int, int], float]:
    """Every process's CPU seconds now: what those already running had spent before the command."""
    return dict(filter(None, map(_read, filter(str.isdigit, os.listdir("/proc")))))


def sample(every: float, done: threading.Event, before: dict[tuple[int, int], float]) -> dict[tuple[int, int], list]:
    """{(pid, start): [cpu seconds since the command began, command line]} of every process seen until `done`."""
    seen: dict[tuple[int, int], list] = {}
    me = os.getpid()
    while not done.wait(every):
        for pid in filter(str.isdigit, os.listdir("/proc")):
            read = _read(pid)
            if read is None or read[0][0] == me:
                continue
            key, cpu = read
            cpu -= before.get(key, 0.0)
            if key not in seen:
                seen[key] = [cpu, _command(key[0])]
            elif cpu != seen[key][0]:
                seen[key][0] = cpu
                seen[key][1] = _command(key[0]) or seen[key][1]
    return seen


def report(seen: dict[tuple[int, int], list], wall: float, top: int) -> None:
    by_kind, count = Counter(), Counter()
    by_line: Counter = Counter()
    for cpu, command in seen.values():
        by_kind[kind_of(command)] += cpu
        count[kind_of(command)] += 1
        by_line[re.sub(r"\b\d+\b", "N", re.sub(r"/tmp/\S+", "TMP", command))[:110]] += cpu
    total = sum(by_kind.values())
    cpus = os.cpu_count() or 1
    print(f"{total:.0f} CPU-s in {wall:.0f} s on {cpus} CPUs ({total / wall / cpus:.0%} of them)")
    for name, cpu in by_kind.most_common():
        print(f"{cpu:8.1f} s {count[name]:6d} processes  {name}")
    print(f"the {top} heaviest command lines:")
    for line, cpu in by_line.most_common(top):
        print(f"{cpu:8.1f} s  {line!r}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--every", type=float, default=0.2)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--json", type=Path)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    done = threading.Event()
    found: dict = {}
    before = snapshot()
    sampler = threading.Thread(target=lambda: found.update(sample(args.every, done, before)), daemon=True)
    sampler.start()
    began = time.monotonic()
    code = subprocess.call(command)
    done.set()
    sampler.join()
    report(found, time.monotonic() - began, args.top)
    if args.json:
        args.json.write_text(json.dumps([[key[0], cpu, line] for key, (cpu, line) in found.items()]))
    return code


if __name__ == "__main__":
    sys.exit(main())
