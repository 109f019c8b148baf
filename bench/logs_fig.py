"""Figure 5 (log throughput): a 2-node job (1 process each) printing 1,000,000 short lines in total
(bench/workloads/lines.py: 500,000 per rank, 100 lines per write+flush), under torchrun.

- `inv launch` attached, its stdout to a file (the lines come back over SSH, prefixed `node-1 r1  | ...`);
- the floor: the same two torchrun processes started locally, writing to a local file;
- for the diagnosis: the floor with `--tee 3 --log-dir` (torchrun's own tailing, one Python call per line: what
  the launcher used before its agent tailed the `--redirects 3` files itself), and (a) the ssh loop writing to a
  local file.
Then the launcher's output is checked: every line arrives once, whole, and in order per rank.
"""

from __future__ import annotations

import re
import shlex
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.baselines import ssh_loop_script
from bench.common import REPO, Box, free_port, log, note_runs, ratio, run_timed, sandbox_of, stats
from bench.job import with_port

NODES = 2
SCRIPT = "bench/workloads/lines.py"
TARGET = 1.10
PREFIXED = re.compile(r"^(node-\d+) +r(\d+) +\| (.*)$")
JOB_LINE = re.compile(r"^rank (\d+) line (\d+)$")


def torchrun(python: str, rank: int, master: str, port: int, per_rank: int, tee_dir: str | None = None) -> list[str]:
    tee = ["--tee", "3", "--log-dir", tee_dir] if tee_dir else []
    return [python, "-m", "torch.distributed.run", "--nnodes", str(NODES), "--node-rank", str(rank),
            "--nproc-per-node", "1", "--master-addr", master, "--master-port", str(port), *tee, SCRIPT,
            str(per_rank)]


def verify(path: Path, per_rank: int, prefixed: bool) -> dict[str, Any]:
    """Every job line once, whole, in order per rank; with `prefixed`, the prefix's rank matches the line's."""
    next_index = {r: 0 for r in range(NODES)}
    problems: list[str] = []
    other = 0
    with open(path, encoding="utf-8", errors="replace") as f:
        for raw in f:
            line = raw.rstrip("\n")
            if prefixed:
                m = PREFIXED.match(line)
                if not m:
                    other += 1
                    continue
                tag_rank, text = int(m.group(2)), m.group(3)
            else:
                tag_rank, text = None, line
            if text.startswith("[default"):  # torchrun --tee's prefix left in (floor with tee)
                text = text.split(":", 1)[1]
            j = JOB_LINE.match(text)
            if not j:
                if "rank" in text and "line" in text and len(problems) < 5:
                    problems.append(f"broken line: {line[:120]!r}")
                other += 1
                continue
            rank, index = int(j.group(1)), int(j.group(2))
            if tag_rank is not None and tag_rank != rank and len(problems) < 5:
                problems.append(f"rank {rank}'s line tagged r{tag_rank}")
            if rank not in next_index:
                problems.append(f"unknown rank {rank}")
                continue
            if index != next_index[rank]:
                if len(problems) < 5:
                    problems.append(f"rank {rank}: line {index} where {next_index[rank]} was due")
                next_index[rank] = max(next_index[rank], index + 1)
            else:
                next_index[rank] += 1
    missing = [r for r, n in next_index.items() if n != per_rank]
    problems += [f"rank {r}: {next_index[r]} lines of {per_rank}" for r in missing]
    return {"ok": not problems, "problems": problems, "other_lines": other}


FAILURES: list[dict[str, Any]] = []
"""Launches that failed, kept for the report (and retried)."""


def launcher_run(box: Box, root: Path, per_rank: int, k: int, tries: int = 3) -> tuple[float, dict[str, Any]]:
    out = root / f"launcher-{k}.out"
    for attempt in range(tries):
        inventory = with_port(box, free_port(), root)
        with open(out, "wb") as sink:
            result = run_timed([sys.executable, "-m", "invoke", "launch", "--hosts", str(inventory)], stdout=sink,
                               timeout=300, env={"INVOKE_LAUNCHER_LOG_DIR": str(root / "logs")})
        note_runs(result.stderr)
        if result.code == 0:
            break
        FAILURES.append({"nodes": NODES, "code": result.code, "seconds": round(result.seconds, 3),
                         "stderr_tail": result.stderr[-1500:]})
        log(f"logs: inv launch failed (exit {result.code}), try {attempt + 1}/{tries}")
    if result.code != 0:
        raise RuntimeError(f"inv launch failed (exit {result.code}):\n{result.stderr[-2000:]}")
    check = verify(out, per_rank, prefixed=True)
    check["controller_cpu_s"] = result.cpu_s
    out.unlink()
    return result.seconds, check


def local_run(box: Box, root: Path, per_rank: int, k: int, tee: bool) -> tuple[float, dict[str, Any]]:
    port = free_port()
    tee_dir = tempfile.mkdtemp(prefix="tee-", dir=root) if tee else None
    script = "\n".join([f"{shlex.join(torchrun(box.python, i, '127.0.0.1', port, per_rank, tee_dir))} &"
                        for i in range(NODES)] + ["wait"])
    out = root / f"local-{k}.out"
    with open(out, "wb") as sink:
        result = run_timed(["bash", "-c", script], stdout=sink, timeout=300, env={"TMPDIR": str(box.root)})
    if result.code != 0:
        raise RuntimeError(f"local torchrun failed (exit {result.code}):\n{result.stderr[-2000:]}")
    check = verify(out, per_rank, prefixed=False)
    out.unlink()
    return result.seconds, check


def ssh_run(box: Box, root: Path, per_rank: int, k: int) -> tuple[float, dict[str, Any]]:
    port = free_port()
    commands = [f"cd {shlex.quote(str(REPO))} && {box.tmp_words}"
                + shlex.join(torchrun(box.python, i, "node-0", port, per_rank)) for i in range(NODES)]
    out = root / f"ssh-{k}.out"
    with open(out, "wb") as sink:
        result = run_timed(["bash", "-c", ssh_loop_script(box.ssh_config, commands)], stdout=sink, timeout=300)
    if result.code != 0:
        raise RuntimeError(f"the ssh loop failed (exit {result.code}):\n{result.stderr[-2000:]}")
    check = verify(out, per_rank, prefixed=False)
    out.unlink()
    return result.seconds, check


def run(repeat: int, root: Path, total_lines: int = 1_000_000, diagnostics: bool = True) -> dict[str, Any]:
    per_rank = total_lines // NODES
    variants = ["local", "launcher"] + (["local_tee", "ssh_loop"] if diagnostics else [])
    times: dict[str, list[float]] = {v: [] for v in variants}
    checks: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    with sandbox_of(NODES, root, script=SCRIPT, script_args=[str(per_rank)]) as box:
        log(f"logs: {NODES} nodes, {total_lines:,} lines")
        if diagnostics:
            local_run(box, root, per_rank, -1, tee=False)  # untimed warm-up
        for k in range(repeat):
            order = variants[k % len(variants):] + variants[:k % len(variants)]
            for variant in order:
                if variant == "launcher":
                    seconds, check = launcher_run(box, root, per_rank, k)
                elif variant == "ssh_loop":
                    seconds, check = ssh_run(box, root, per_rank, k)
                else:
                    seconds, check = local_run(box, root, per_rank, k, tee=variant == "local_tee")
                times[variant].append(seconds)
                checks[variant].append(check)
        summary: dict[str, Any] = {v: stats(times[v]) for v in variants}
    summary["launcher_over_floor"] = ratio(summary["launcher"], summary["local"])
    if diagnostics:
        summary["launcher_over_floor_tee"] = ratio(summary["launcher"], summary["local_tee"])
        summary["ssh_loop_over_floor"] = ratio(summary["ssh_loop"], summary["local"])
        summary["launcher_over_a"] = ratio(summary["launcher"], summary["ssh_loop"])
    summary["lines_ok"] = all(c["ok"] for c in checks["launcher"])
    summary["line_problems"] = sorted({p for c in checks["launcher"] for p in c["problems"]})[:10]
    summary["other_lines"] = max(c["other_lines"] for c in checks["launcher"])
    summary["launcher_controller_cpu_s"] = stats([c["controller_cpu_s"] for c in checks["launcher"]])
    summary["baselines_ok"] = {v: all(c["ok"] for c in checks[v]) for v in variants if v != "launcher"}
    summary["launcher_ok"] = (summary["launcher_over_floor"] is not None
                              and summary["launcher_over_floor"] <= TARGET and summary["lines_ok"])
    summary.update(total_lines=total_lines, per_rank=per_rank, batch="100 lines per write+flush", repeat=repeat,
                   failed_launches=FAILURES)
    log(f"logs: floor {summary['local']['median']:.2f}s, launcher {summary['launcher']['median']:.2f}s, "
        f"lines ok {summary['lines_ok']}")
    return summary
