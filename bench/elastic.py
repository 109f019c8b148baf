"""Figure (elastic): from a node's death to training resumed on the survivors, caused for real.

On a fresh 3-node sandbox per run, train/ddp.py (1 rank per node, a checkpoint every 4 steps, 0.25 s a step):
  retry   static rendezvous, `inv launch --retries 1`: node 2 dies (its agent and every process of the run killed
          with SIGKILL, then its sshd stopped); the launcher finds it, runs the doctor's fast checks, leaves node 2
          out and starts the run again on nodes 0 and 1 with --resume
  c10d    `rendezvous: {backend: c10d, nodes: "2:3", max_restarts: 1, conf: C10D_CONF}`: node 2's
          torchrun is killed with SIGKILL; torchrun re-forms the group on nodes 0 and 1 and restarts the workers,
          which resume from the checkpoint (no relaunch)
Each run: the time from the kill to the first `resumed from` line on the launcher's console (the new workers have
loaded the checkpoint: training goes on). The launcher is then interrupted (Ctrl-C), and the bench checks that no
process of any of its runs is left. `retry_wait` is 0.5 s (invoke.yaml's default is 3 s: add the difference).
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from bench.common import REPO, kill_marked, log, read_text, run_processes, sandbox_of, stats, wait_gone, wait_until
from devtools import sandbox
from devtools.observe import children, pids_with_env, sshd_family
from launcher.node.wire import RUN_ID_ENV

NODES = 3
TRAIN = ["--epochs", "3", "--dataset-size", "576", "--batch-size", "16", "--log-every", "4", "--checkpoint-every",
         "4", "--sleep-per-step", "0.25"]
C10D_CONF = {"last_call_timeout": 1, "keep_alive_interval": 1, "keep_alive_max_attempt": 3}
"""A lost node is noticed by the rendezvous after keep_alive_interval x keep_alive_max_attempt seconds (torch's
defaults: 5 x 3 = 15 s) before the group re-forms."""
RETRY_WAIT_S = 0.5
CAP_S = 120.0
POLL_S = 0.02
RUN_IDS = re.compile(r"run (\d{8}-\d{6}-[0-9a-f]{6})")




_wait_for = functools.partial(wait_until, poll=POLL_S)
"""Wait for a condition at this figure's poll interval (common.wait_until)."""

def _launch(inventory: Path, root: Path, ckpt: Path, out: Path, retries: bool) -> subprocess.Popen[bytes]:
    env = {**os.environ, "INVOKE_LAUNCHER_LOG_DIR": str(root / "logs"),
           "INVOKE_LAUNCHER_RETRY_WAIT": str(RETRY_WAIT_S)}
    argv = [sys.executable, "-m", "invoke", "launch", "--hosts", str(inventory), "--script", "train/ddp.py",
            "--args", " ".join([*TRAIN, "--checkpoint-dir", str(ckpt)])]
    if retries:
        argv += ["--retries", "1"]
    with open(out, "wb") as sink:
        return subprocess.Popen(argv, cwd=REPO, env=env, stdout=sink, stderr=subprocess.STDOUT,
                                start_new_session=True)


def _kill_node(box: Any, run_id: str) -> None:
    """Node 2 dies: its agent and the run's processes there by SIGKILL, then its sshd."""
    node = box.box.nodes[2]
    family = sshd_family(node.pid)
    agents = [c for pid in family for c in children(pid) if c not in family]
    for pid in [*agents, *pids_with_env(f"{RUN_ID_ENV}={run_id}/{node.name}".encode())]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    sandbox.stop_node(box.box.state_dir, 2)


def _kill_torchrun(run_id: str) -> None:
    found = [pid for pid in pids_with_env(f"{RUN_ID_ENV}={run_id}/node-2".encode())
             if b"torch.distributed.run" in Path(f"/proc/{pid}/cmdline").read_bytes()]
    if len(found) != 1:
        raise RuntimeError(f"elastic bench: expected node-2's torchrun, found {found}")
    os.kill(found[0], signal.SIGKILL)


def once(mode: str, root: Path, k: int) -> dict[str, Any]:
    folder = root / f"elastic-{mode}-{k}"
    folder.mkdir(parents=True)
    out, ckpt = folder / "out", folder / "ckpt"
    with sandbox_of(NODES, folder) as box:
        if mode == "c10d":
            data = yaml.safe_load(box.inventory.read_text())
            data["rendezvous"].update(backend="c10d", nodes="2:3", max_restarts=1, conf=C10D_CONF)
            box.inventory.write_text(yaml.safe_dump(data, sort_keys=False))
        proc = _launch(box.inventory, folder, ckpt, out, retries=mode == "retry")
        try:
            _wait_for(lambda: "checkpoint saved" in read_text(out), CAP_S, "a checkpoint")
            run_id = RUN_IDS.search(read_text(out)).group(1)  # type: ignore[union-attr]
            before = read_text(out).count("resumed from")
            t0 = time.monotonic()
            _kill_node(box, run_id) if mode == "retry" else _kill_torchrun(run_id)
            _wait_for(lambda: read_text(out).count("resumed from") > before, CAP_S, "training resumed")
            took = time.monotonic() - t0
            os.killpg(proc.pid, signal.SIGINT)  # the figure is taken: stop the rest of the training
            code = proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        ids = list(dict.fromkeys(RUN_IDS.findall(read_text(out))))
        left = 0
        for rid in ids:
            wait_gone(lambda rid=rid: run_processes(rid), 15)
            left += kill_marked(f"{RUN_ID_ENV}={rid}/".encode())
    log(f"elastic {mode} #{k}: resumed {took:.2f}s after the kill; {len(ids)} run id(s); exit {code}; left {left}")
    return {"seconds": round(took, 3), "runs": len(ids), "exit_code": code, "left": left}


def run(repeat: int, root: Path) -> dict[str, Any]:
    """Each mode `repeat` times, interleaved."""
    results: dict[str, list[dict[str, Any]]] = {"retry": [], "c10d": []}
    for k in range(repeat):
        for mode in results:
            results[mode].append(once(mode, root, k))
    return {mode: {"resumed_s": stats([r["seconds"] for r in runs]), "runs": runs,
                   "left": sum(r["left"] for r in runs)} for mode, runs in results.items()}


if __name__ == "__main__":
    import json
    import tempfile

    with tempfile.TemporaryDirectory(prefix="bench-elastic-") as tmp:
        print(json.dumps(run(int(sys.argv[1]) if len(sys.argv) > 1 else 1, Path(tmp)), indent=1))
