"""launcher/node/probe/probe.py run here as a node runs it, without SSH."""

from __future__ import annotations

import json
import subprocess
from typing import Any

from launcher import doctor
from launcher.transport.program import BOOTSTRAP
from tests.support.nodeenv import node_python


def run_probe(request: dict[str, Any], env: dict[str, str] | None = None,
               python: str | None = None) -> dict[str, Any]:
    result = subprocess.run([python or node_python(), "-c", BOOTSTRAP], input=doctor.probe_input(request),
                            capture_output=True, timeout=30, env=env)
    assert result.returncode == 0, result.stderr.decode()
    return json.loads(result.stdout)
