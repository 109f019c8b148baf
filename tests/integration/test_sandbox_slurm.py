"""The sandbox's SLURM cluster: slurm.conf rendered, then srun on real slurmds inside the nodes' namespaces."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from collections.abc import Callable

import pytest

from devtools import sandbox
from devtools.observe import children, gone, processes_mentioning
from devtools.sandbox import Sandbox, SandboxError, node_cache, procs
from devtools.sandbox import slurm as slurm_cluster

STEPD = os.path.realpath(slurm_cluster.SLURMSTEPD)

# ---------------------------------------------------------------------------------------------------------
# Pure: slurm.conf and the environment that points at it.


# ---------------------------------------------------------------------------------------------------------
# Real: munged, slurmctld and a slurmd per node.


def _env(box: Sandbox) -> dict[str, str]:
    """This environment less any outer allocation's SLURM_*, pointed at the sandbox's cluster."""
    return {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")} | sandbox.slurm_env(box.state_dir)


def _srun(box: Sandbox, *args: str) -> list[str]:
    done = subprocess.run(
        ["srun", "-N2", "--ntasks-per-node=1", *args], env=_env(box), capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    return sorted(done.stdout.splitlines())


def _wait(what: str, found: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not found():
        assert time.monotonic() < deadline, f"no {what} within {timeout:g} s"
        time.sleep(0.05)


@pytest.mark.integration
def test_srun_runs_on_each_node(make_sandbox) -> None:
    box = make_sandbox(2, slurm=True)
    assert box.slurm_conf == sandbox.slurm_conf_path(box.state_dir) and box.slurm_conf.is_file()
    assert sandbox.load(box.state_dir).slurm_conf == box.slurm_conf
    assert _srun(box, "--label", "hostname") == ["0: node-0", "1: node-1"]
    assert _srun(box, "sh", "-c", 'echo "$SLURM_NODEID $(hostname)"') == ["0 node-0", "1 node-1"]
    # Each node's tasks have its own cache home (run directories), as its SSH sessions do.
    assert _srun(box, "sh", "-c", 'echo "$XDG_CACHE_HOME"') == [str(node_cache(box.state_dir, i)) for i in (0, 1)]


@pytest.mark.integration
def test_srun_tasks_see_their_nodes_hosts_file(make_sandbox) -> None:
    box = make_sandbox(2, slurm=True, unresolvable={1: [0]})
    probe = 'getent hosts node-0 >/dev/null && echo "$(hostname) resolves" || echo "$(hostname) cannot"'
    assert _srun(box, "sh", "-c", probe) == ["node-0 resolves", "node-1 cannot"]


@pytest.mark.integration
def test_down_stops_daemons_and_running_steps(make_sandbox) -> None:
    box = make_sandbox(2, slurm=True)
    daemons = json.loads((box.state_dir / "sandbox.json").read_text())["slurm"]["daemons"]
    assert [d["name"] for d in daemons] == ["munged", "slurmctld", "slurmd node-0", "slurmd node-1"]
    step = subprocess.Popen(
        ["srun", "-N2", "--ntasks-per-node=1", "sleep", "300"],
        env=_env(box),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    # Held open, the nodes' namespaces keep naming them after down, so strays there can still be found.
    with procs.Namespaces("uts") as nodes:
        try:
            for node in box.nodes:
                nodes.hold(node.pid, procs.start_time(node.pid))

            def stepds() -> list[int]:
                return [pid for pid in procs.pids() if pid in nodes and procs.exe(pid) == STEPD and procs.alive(pid)]

            _wait("slurmstepd with a task on both nodes", lambda: len([p for p in stepds() if children(p)]) == 2)
            steps = stepds()
            tasks = [child for pid in steps for child in children(pid)]
            lines = sandbox.down(box.state_dir)
            assert [line for line in lines if line.startswith("SLURM")] == [
                f"SLURM {d['name']} (pid {d['pid']}): stopped" for d in (daemons[1], *daemons[2:], daemons[0])
            ]
            left = [pid for pid in [d["pid"] for d in daemons] + steps + tasks if not gone(pid)]
            assert not left, f"still alive: {left}"
            assert not stepds() and not [pid for pid in procs.pids() if pid in nodes and not gone(pid)]
            assert not processes_mentioning(str(box.state_dir))
        finally:
            step.kill()
            step.wait()


@pytest.mark.integration
def test_failed_start_names_the_log_and_leaves_nothing(make_sandbox, monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as busy:  # node-1's slurmd port, taken: its slurmd exits right away
        busy.bind(("", 0))
        busy.listen()
        free = slurm_cluster.free_ports
        monkeypatch.setattr(slurm_cluster, "free_ports", lambda count: [*free(count - 1), busy.getsockname()[1]])
        with pytest.raises(SandboxError, match=r"slurmd node-1 exited: .*Address already in use.*slurmd-node-1\.log"):
            make_sandbox(2, slurm=True)
    state_dir = make_sandbox.state_dirs[-1]
    assert not (state_dir / "sandbox.json").exists()
    assert not processes_mentioning(str(state_dir))  # each daemon names a file of its cluster on its command line
