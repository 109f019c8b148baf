"""Figure 2 (a real job): train/ddp.py for a few steps on N nodes, 1 process each.

`inv launch --hosts INV` against (a) the ssh loop running the same torchrun command on every node and (d) the
floor: the same torchrun processes started locally, without SSH. Each run gets a fresh master port.
"""

from __future__ import annotations

import re
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from bench.baselines import ssh_loop
from bench.common import REPO, Box, free_port, log, note_runs, paired_ratio, ratio, run_timed, sandbox_of, stats

JOB_ARGS = ["--max-steps", "20", "--dataset-size", "512", "--say-first-step"]
FIRST_STEP = re.compile(r"first optimizer step rank (\d+) at wall ([\d.]+)")
SCRIPT = "train/ddp.py"
TARGET = 1.03


def torchrun_argv(python: str, n: int, rank: int, master: str, port: int) -> list[str]:
    return [python, "-m", "torch.distributed.run", "--nnodes", str(n), "--node-rank", str(rank),
            "--nproc-per-node", "1", "--master-addr", master, "--master-port", str(port), SCRIPT, *JOB_ARGS]


def with_port(box: Box, port: int, root: Path) -> Path:
    """A copy of the sandbox's inventory with another master port (one per run: no TIME_WAIT surprises)."""
    data = yaml.safe_load(box.inventory.read_text())
    data["rendezvous"]["master_port"] = port
    path = root / f"inventory-{port}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def first_step_s(result: Any, ranks: int) -> float | None:
    """Command -> first optimizer step on every rank: the latest rank's own wall-clock line less the spawn's wall
    clock (the sandbox's nodes share this machine's clock); None unless every rank said it."""
    said = {int(rank): float(wall) for rank, wall in FIRST_STEP.findall(result.stdout + result.stderr)}
    return round(max(said.values()) - result.began, 3) if len(said) == ranks else None


def check(result: Any, what: str) -> None:
    text = result.stdout + result.stderr
    if result.code != 0 or "finished at step" not in text:
        raise RuntimeError(f"{what} failed (exit {result.code}):\n{text[-3000:]}")


FAILURES: list[dict[str, Any]] = []
"""Launches that failed, kept for the report (and retried): a figure should not hide them."""


def launcher_run(box: Box, root: Path, extra: list[str], tries: int = 3, page: bool = True) -> Any:
    """`page` False: the run's page off (`page: false`), the launch otherwise the same: what the page costs."""
    for attempt in range(tries):
        inventory = with_port(box, free_port(), root)
        result = run_timed([sys.executable, "-m", "invoke", "launch", "--hosts", str(inventory), *extra],
                           timeout=180, env={"INVOKE_LAUNCHER_LOG_DIR": str(root / "logs"),
                                             "INVOKE_LAUNCHER_PAGE": "1" if page else "0"})
        ids = note_runs(result.stderr)
        try:
            check(result, "inv launch")
            if page:
                wait_for_pages(root / "logs", ids)
            return result
        except RuntimeError as exc:
            FAILURES.append({"nodes": box.n, "code": result.code, "seconds": round(result.seconds, 3),
                             "stderr_tail": str(exc)[-1500:]})
            log(f"real job: inv launch failed on {box.n} nodes (exit {result.code}), try {attempt + 1}/{tries}")
            if attempt == tries - 1:
                raise


def wait_for_pages(logs: Path, run_ids: list[str], limit_s: float = 60.0) -> None:
    """Untimed: until each run's page (written by a process of its own after the launch returned) is there, so that
    it draws on no other variant's time (on the sandbox's 2 CPUs it would)."""
    deadline = time.monotonic() + limit_s
    for run_id in run_ids:
        folder = logs / run_id
        while not ((folder / "report.html").exists() or (folder / "report.err").exists()) \
                and time.monotonic() < deadline:
            time.sleep(0.2)


def ssh_run(box: Box) -> Any:
    port = free_port()
    commands = [f"cd {shlex.quote(str(REPO))} && {box.tmp_words}"
                + shlex.join(torchrun_argv(box.python, box.n, i, "node-0", port)) for i in range(box.n)]
    result = ssh_loop(box.ssh_config, commands, timeout=180)
    check(result, "the ssh loop")
    return result


def local_run(box: Box) -> Any:
    port = free_port()
    script = "\n".join([f"{shlex.join(torchrun_argv(box.python, box.n, i, '127.0.0.1', port))} &"
                        for i in range(box.n)] + ["wait"])
    result = run_timed(["bash", "-c", script], timeout=180, env={"TMPDIR": str(box.root)})
    check(result, "the local torchrun")
    return result


def _median(variant: dict[str, Any]) -> str:
    first = variant.get("first_step_s")
    return f"{first['median']:.2f}s" if first else "?"


def run(sizes: list[int], repeat: int | dict[int, int], root: Path, skip_doctor_too: bool,
        warm_up: bool = True, page_off_too: bool = False) -> dict[str, Any]:
    """`repeat`: runs per N (a number, or N -> runs, 3 for an N it does not name). `page_off_too`: the launch with the
    run's page off as well, interleaved, so that the page's cost to the command is a paired ratio."""
    rows = []
    for n in sizes:
        runs = repeat if isinstance(repeat, int) else repeat.get(n, 3)
        with_skip = skip_doctor_too  # --skip-doctor too: what the preflight costs at each N
        variants = (["ssh_loop", "launcher", "local"] + (["launcher_skip_doctor"] if with_skip else [])
                    + (["launcher_page_off"] if page_off_too else []))
        with sandbox_of(n, root, script=SCRIPT, script_args=JOB_ARGS) as box:
            log(f"real job: {n} nodes")
            if warm_up:
                ssh_run(box)  # untimed: the first sessions of a fresh sandbox are slower
            times: dict[str, list[float]] = {v: [] for v in variants}
            cpu: dict[str, list[float]] = {v: [] for v in variants}
            first: dict[str, list[float]] = {v: [] for v in variants}
            for rep in range(runs):
                order = variants[rep % len(variants):] + variants[:rep % len(variants)]
                for variant in order:
                    if variant == "ssh_loop":
                        result = ssh_run(box)
                    elif variant == "local":
                        result = local_run(box)
                    else:
                        result = launcher_run(box, root, ["--skip-doctor"] if variant.endswith("doctor") else [],
                                              page=variant != "launcher_page_off")
                    times[variant].append(result.seconds)
                    cpu[variant].append(result.cpu_s)
                    stepped = first_step_s(result, n)
                    if stepped is not None:
                        first[variant].append(stepped)
            row: dict[str, Any] = {"nodes": n, **{v: {**stats(times[v]), "controller_cpu_s": stats(cpu[v]),
                                                      "first_step_s": stats(first[v]) if first[v] else None}
                                                  for v in variants}}
            row["launcher_over_a_paired"] = paired_ratio(row["launcher"], row["ssh_loop"])
            row["launcher_over_a"] = ratio(row["launcher"], row["ssh_loop"])
            row["launcher_over_d"] = ratio(row["launcher"], row["local"])
            row["a_over_d"] = ratio(row["ssh_loop"], row["local"])
            row["launcher_ok"] = row["launcher_over_a"] is not None and row["launcher_over_a"] <= TARGET
            if page_off_too:  # the page is written after the command returns: this should stay at 1.00
                row["page_on_over_off_paired"] = paired_ratio(row["launcher"], row["launcher_page_off"])
            if with_skip:
                row["skip_doctor_over_a"] = ratio(row["launcher_skip_doctor"], row["ssh_loop"])
                row["skip_doctor_over_a_paired"] = paired_ratio(row["launcher_skip_doctor"], row["ssh_loop"])
            rows.append(row)
            log(f"real job {n}: a {row['ssh_loop']['median']:.2f}s, inv launch {row['launcher']['median']:.2f}s, "
                f"local {row['local']['median']:.2f}s; command -> first optimizer step on every rank: "
                f"{_median(row['ssh_loop'])} (ssh loop), {_median(row['launcher'])} (inv launch)")
    return {"rows": rows, "job": f"{SCRIPT} {' '.join(JOB_ARGS)}", "failed_launches": FAILURES,
            "repeat": repeat if isinstance(repeat, int) else {str(k): v for k, v in repeat.items()}}
