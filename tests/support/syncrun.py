"""launcher/node/syncd.py run here as a node runs it (the bootstrap, its request, a stream of entries)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from launcher.limits import SYNC_TIMING
from launcher.sync.push import SYNCD_SOURCE
from launcher.transport.program import BOOTSTRAP, program_input
from tests.support.nodeenv import node_python


def syncd(dest: Path | str, paths: list[str], stream: bytes | None, env: dict[str, str] | None = None,
          **request: object) -> tuple[list[dict], int]:
    """Run launcher/node/syncd.py through the bootstrap (`env`: changes to the node's environment); `stream` (None:
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
