"""launcher/node/sync/syncd.py run here as a node runs it (the bootstrap, its request, a stream of entries), and the
sandbox's nodes given a workdir each for `inv sync` run from a tree of one's choosing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from devtools import sandbox
from launcher.limits import SYNC_TIMING
from launcher.sync.nodepush import SYNCD_SOURCE
from launcher.transport.program import BOOTSTRAP, program_input
from tests.helpers import REPO
from tests.support.nodeenv import node_python


def syncd(dest: Path | str, paths: list[str], stream: bytes | None, env: dict[str, str] | None = None,
          **request: object) -> tuple[list[dict], int]:
    """Run launcher/node/sync/syncd.py through the bootstrap (`env`: changes to the node's environment); `stream` (None:
    none) goes after its first answer."""
    proc = subprocess.Popen([node_python(), "-c", BOOTSTRAP], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            env={**os.environ, **(env or {})})
    assert proc.stdin and proc.stdout
    request = {"dest": str(dest), "paths": paths, "token": "t0", "lock_wait": 5.0, "timing": SYNC_TIMING, **request}
    proc.stdin.write(program_input(SYNCD_SOURCE, request))
    proc.stdin.flush()
    answers = [json.loads(proc.stdout.readline())]
    if "error" not in answers[0]:
        try:
            proc.stdin.write(stream or b"")
            proc.stdin.close()
        except BrokenPipeError:
            pass
        answers += [json.loads(line) for line in proc.stdout.read().splitlines()]
    return answers, proc.wait(timeout=30)


def frame(path: str, data: bytes = b"", kind: str = "file", target: str | None = None) -> bytes:
    header = {"path": path, "kind": kind, "size": len(data), "mtime_ns": 1_600_000_000_000_000_000, "mode": 0o644}
    if target is not None:
        header["target"] = target
    return (json.dumps(header) + "\n").encode() + data


END = b'{"end": true}\n'


def start_syncd(dest: Path, paths: list[str], **request: object) -> subprocess.Popen[bytes]:
    """syncd started through the bootstrap with its request sent, left running: the test reads and writes its pipes."""
    proc = subprocess.Popen([node_python(), "-c", BOOTSTRAP], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdin and proc.stdout
    request = {"dest": str(dest), "paths": paths, "token": "t1", "timing": SYNC_TIMING, **request}
    proc.stdin.write(program_input(SYNCD_SOURCE, request))
    proc.stdin.flush()
    return proc


def own_workdirs(box: sandbox.Sandbox, root: Path, **top: object) -> list[Path]:
    """Give each sandbox node a workdir of its own (they share one file system); returns them."""
    data = yaml.safe_load(box.inventory.read_text())
    workdirs = [root / f"node-{i}" / "work" for i in range(len(box.nodes))]
    data["hosts"] = [{"name": f"node-{i}", "workdir": str(w)} for i, w in enumerate(workdirs)]
    data.update(top)
    box.inventory.write_text(yaml.safe_dump(data, sort_keys=False))
    return workdirs


def inv_in(cwd: Path, *args: str, log_dir: Path | None = None, timeout: float = 180
           ) -> subprocess.CompletedProcess[str]:
    """`inv ARGS` with this repo's tasks, run from `cwd` (the tree `inv sync` sends by default)."""
    env = {**os.environ, **({"INVOKE_LAUNCHER_LOG_DIR": str(log_dir)} if log_dir else {})}
    return subprocess.run([sys.executable, "-m", "invoke", "-r", str(REPO), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout, check=False)


def relative_files(root: Path) -> set[str]:
    """The files under `root`, by their path from it (folders not listed)."""
    return {str(p.relative_to(root)) for p in root.rglob("*") if not p.is_dir()}
