"""Which interface the doctor's probe reports and which one the agent gives NCCL/GLOO_SOCKET_IFNAME for one
master_addr, each found by its own node program run here as a node runs it. Run under `unshare --mount` with
another /etc/hosts (and /etc/gai.conf) to give the name several addresses in a chosen order:
`python3 -m tests.support.ifaces NAME PORT WORKDIR` prints {"probe": ..., "agent": ...} as JSON."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

from launcher.config.fields import RESERVED_ENV
from launcher.node.protocol import RUN_ID_ENV, RUNS_ROOT
from launcher.run.start import agent_input, log_tail_settings, stacks_settings
from launcher.transport.program import BOOTSTRAP
from tests.support.nodeenv import node_python
from tests.support.proberun import run_probe

DUMP = "import json, os, sys; json.dump(dict(os.environ), open(sys.argv[1], 'w'))"


def agent_iface(master: str, port: int, workdir: Path) -> str | None:
    """NCCL_SOCKET_IFNAME as the agent sets it for `socket_ifname: auto` (a started run that dumps its env)."""
    run_id = f"20000101-000000-{secrets.token_hex(3)}"
    dump = workdir / "env.json"
    request = {"action": "start", "run_dir": f"{RUNS_ROOT}/{run_id}/node1", "mark": f"{run_id}/node1",
               "workdir": str(workdir), "argv": [sys.executable, "-c", DUMP, str(dump)], "expand_home": [],
               "env": {}, "launcher_env": {}, "secret_names": [], "unset_env": list(RESERVED_ENV),
               "socket_ifname": "auto", "master_addr": master, "master_port": port, "node_rank": 0, "detach": False,
               "grace": 5.0, "heartbeat_timeout": 30.0, "alive_interval": 5.0, "log_tail": log_tail_settings(),
               **stacks_settings(), "watch": True}
    env = {k: v for k, v in os.environ.items() if k != RUN_ID_ENV} | {"XDG_CACHE_HOME": str(workdir / "cache")}
    stdin = agent_input(request) + b"go\n"
    # stdin stays open until the run ends: for an attached run, its end means "the launcher is gone".
    proc = subprocess.Popen([node_python(), "-c", BOOTSTRAP], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, env=env)
    assert proc.stdin is not None and proc.stderr is not None
    proc.stdin.write(stdin)
    proc.stdin.flush()
    try:
        code = proc.wait(timeout=60)
    finally:
        proc.stdin.close()
        if proc.poll() is None:
            proc.kill()
    if code != 0 or not dump.exists():
        return f"error: exit {code}: {proc.stderr.read().decode(errors='replace')[-400:]}"
    return json.loads(dump.read_text()).get("NCCL_SOCKET_IFNAME")


def probe_iface(master: str, port: int, workdir: Path) -> dict[str, str | None]:
    """The probe's `route` answer (what the doctor's iface finding says) for `master`."""
    answer = run_probe({"mode": "probe", "checks": "fast", "names": [master], "master_addr": master,
                        "master_port": port, "workdir": str(workdir), "resolve_workers": 4})
    return answer["route"]


if __name__ == "__main__":
    name, port, folder = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
    print(json.dumps({"probe": probe_iface(name, port, folder), "agent": agent_iface(name, port, folder)}))
