"""Which interface the doctor's probe reports and which one the agent gives NCCL/GLOO_SOCKET_IFNAME for one
master_addr, each found by its own node program run here as a node runs it. Run under `unshare --mount` with
another /etc/hosts (and /etc/gai.conf) to give the name several addresses in a chosen order:
`python3 -m tests.support.ifaces NAME PORT WORKDIR` prints {"probe": ..., "agent": ...} as JSON."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from launcher.limits import NVIDIA_SMI_TIMEOUT_S
from tests.support.agentrun import run_agent
from tests.support.proberun import run_probe


def agent_iface(master: str, port: int, workdir: Path) -> str | None:
    """The interface the agent gives torchrun for `socket_ifname: auto` (a started run that dumps its env):
    GLOO_SOCKET_IFNAME, and NCCL_SOCKET_IFNAME the same as `=NAME` (that interface exactly)."""
    code, events, _ = run_agent(workdir, {}, socket_ifname="auto", master_addr=master, master_port=port)
    if code != 0:
        return f"error: exit {code}: {events[-3:]}"
    env = json.loads((workdir / "env.json").read_text())
    if env.get("NCCL_SOCKET_IFNAME") != f"={env.get('GLOO_SOCKET_IFNAME')}":
        return f"error: NCCL {env.get('NCCL_SOCKET_IFNAME')!r}, gloo {env.get('GLOO_SOCKET_IFNAME')!r}"
    return env.get("GLOO_SOCKET_IFNAME")


def probe_iface(master: str, port: int, workdir: Path) -> dict[str, str | None]:
    """The probe's `route` answer (what the doctor's iface finding says) for `master`."""
    answer = run_probe({"mode": "probe", "checks": "fast", "names": [master], "master_addr": master,
                        "master_port": port, "workdir": str(workdir), "resolve_workers": 4,
                        "gpu_timeout_s": NVIDIA_SMI_TIMEOUT_S})
    return answer["route"]


if __name__ == "__main__":
    name, port, folder = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
    print(json.dumps({"probe": probe_iface(name, port, folder), "agent": agent_iface(name, port, folder)}))
