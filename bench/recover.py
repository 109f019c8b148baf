"""Figure (recover): from a hang back to training, unattended (`--on-hang restart --retries 1 --hang-timeout 15`).

A 3-node run of bench/workloads/hang_at_step.py (a tiny model, an optimizer step and an all_reduce a step, a checkpoint
every 5 steps); node-1's rank sleeps for ever at step 12. The launcher finds the hang, stops the attempt, starts the run
again on node-0 and node-2 (the same arguments: the attempt is in DDP_LAUNCHER_ATTEMPT), and the run ends. The figure:
from the hang's start (the last progress the launcher saw) to every rank's first optimizer step in the next attempt, and
where the time went, from the launch's own record (logs/<run>/attempts.json, journal.json): the hang timeout and the two
looks at the stacks (the verdict), the stop, between the attempts (retry_wait, the doctor's checks, the sweep), the next
attempt's start to its first step (torch's import, the rendezvous, the resume). Target: the timeout plus 20 s on the
sandbox.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import yaml

from bench.common import REPO, Box, free_port, log, read_text, run_timed, sandbox_of, stats

NODES = 3
SCRIPT = "bench/workloads/hang_at_step.py"
HANG_TIMEOUT_S = 15.0
TARGET_MARGIN_S = 20.0
AT, EVERY, TOTAL = 12, 5, 200
"""200 steps: the next attempt runs ~10 s, so that a heartbeat (every 5 s) brings its first step's time."""


def _inventory(box: Box, root: Path, k: int) -> Path:
    data = yaml.safe_load(box.inventory.read_text())
    data["rendezvous"]["master_port"] = free_port()
    data["job"] = {"script": SCRIPT, "args": [str(root / f"ckpt-{k}.pt"), str(TOTAL), str(AT), "node-1", str(EVERY)]}
    path = root / f"recover-{k}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _hang_mark(folder: Path) -> float | None:
    """When the launcher said the hang (its journal's mark)."""
    journal = json.loads(read_text(folder / "journal.json") or "{}")
    return next((m["t"] for m in journal.get("marks", []) if m.get("kind") == "hang"), None)


def once(box: Box, root: Path, k: int) -> dict[str, Any]:
    env = {"INVOKE_LAUNCHER_LOG_DIR": str(root / "logs"), "INVOKE_LAUNCHER_RETRY_WAIT": "0.5",
           "INVOKE_LAUNCHER_GRACE": "1", "INVOKE_LAUNCHER_PAGE": "0"}
    result = run_timed([sys.executable, "-m", "invoke", "launch", "--hosts", str(_inventory(box, root, k)),
                        "--retries", "1", "--on-hang", "restart", "--hang-timeout", str(HANG_TIMEOUT_S)],
                       timeout=300, env=env, cwd=REPO)
    if result.code != 0:
        raise RuntimeError(f"the launch failed (exit {result.code}):\n{result.stderr[-2000:]}")
    first, second = _attempts(root, result.stderr)
    said = _hang_mark(root / "logs" / first["run_id"])
    back = second["training_at"] - first["hang_since"]
    return {"back_s": round(back, 2), "verdict_s": round(said - first["hang_since"], 2) if said else None,
            "stop_s": round(first["ended_at"] - said, 2) if said else None,
            "between_s": round(second["started_at"] - first["ended_at"], 2),
            "start_to_step_s": round(second["training_at"] - second["started_at"], 2),
            "resumed_from": second["resumed_from"], "seconds": round(result.seconds, 2)}


def _attempts(root: Path, stderr: str) -> tuple[dict[str, Any], dict[str, Any]]:
    for folder in (root / "logs").iterdir():
        found = json.loads(read_text(folder / "attempts.json") or "[]")
        if len(found) == 2 and found[0]["run_id"] in stderr:
            return found[0], found[1]
    raise RuntimeError(f"no record of the launch's two attempts:\n{stderr[-2000:]}")


def run(repeat: int, root: Path) -> dict[str, Any]:
    runs: list[dict[str, Any]] = []
    with sandbox_of(NODES, root, script=SCRIPT) as box:
        log(f"recover: {NODES} nodes, {repeat} run(s), --hang-timeout {HANG_TIMEOUT_S:g}")
        for k in range(repeat):
            runs.append(once(box, root, k))
            log(f"recover: run {k}: training again {runs[-1]['back_s']} s after the hang began ({runs[-1]})")
    target = HANG_TIMEOUT_S + TARGET_MARGIN_S
    parts = ("verdict_s", "stop_s", "between_s", "start_to_step_s")
    return {"nodes": NODES, "hang_timeout_s": HANG_TIMEOUT_S, "target_s": target, "runs": runs,
            "back": stats([r["back_s"] for r in runs]),
            "parts": {p: stats([r[p] for r in runs if r[p] is not None]) for p in parts},
            "ok": bool(runs) and all(r["back_s"] <= target for r in runs)}
