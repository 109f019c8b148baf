"""The node agent started here as the launcher starts it (the node package and a start request on stdin, then
`go`), running a job that dumps its environment: what torchrun's environment would be on a node."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

from launcher.config.fields import RESERVED_ENV
from launcher.node import wire
from launcher.node.wire import RUNS_ROOT
from launcher.plan.request import log_tail_settings, stacks_settings
from launcher.run.actions import agent_input
from launcher.transport.program import BOOTSTRAP
from tests.support.nodeenv import node_python

DUMP = "import json, os, sys; json.dump(dict(os.environ), open(sys.argv[1], 'w'))"


def run_agent(tmp_path: Path, login: dict[str, str], **request: object) -> tuple[int, list[dict], Path]:
    """Start a dump of torchrun's environment through the local agent, attached; its exit, events and run dir."""
    run_id = f"20000101-000000-{secrets.token_hex(3)}"
    full = {"action": "start", "run_dir": f"{RUNS_ROOT}/{run_id}/node1", "mark": f"{run_id}/node1",
            "workdir": str(tmp_path), "argv": [sys.executable, "-c", DUMP, str(tmp_path / "env.json")],
            "expand_home": [], "env": {}, "launcher_env": {}, "secret_names": [], "unset_env": list(RESERVED_ENV),
            "socket_ifname": None, "master_addr": "127.0.0.1", "master_port": 29400, "node_rank": 0,
            "detach": False, "grace": 5.0, "heartbeat_timeout": 30.0, "alive_interval": 5.0,
            "away_after_s": 15.0, "attach_tail_bytes": 65536, "reattach": False,
            "log_tail": log_tail_settings(), **stacks_settings(), "watch": True, **request}
    env = {**os.environ, **login, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    env.pop(wire.RUN_ID_ENV, None)
    with open(tmp_path / "events", "wb") as events:
        proc = subprocess.Popen([node_python(), "-c", BOOTSTRAP], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                stderr=events, env=env)
        assert proc.stdin is not None
        # The program, its request, and the launcher's `go`: every node is ready.
        proc.stdin.write(agent_input(full) + b"go\n")
        proc.stdin.flush()  # stdin stays open: for an attached run, EOF means "launcher gone"
        try:
            code = proc.wait(timeout=30)
        finally:
            proc.stdin.close()
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    lines = (tmp_path / "events").read_text().splitlines()
    return code, [json.loads(line) for line in lines], tmp_path / "cache" / "ddp-launcher" / "runs" / run_id / "node1"
