"""The sandbox's SLURM cluster: slurm.conf rendered, then srun on real slurmds inside the nodes' namespaces."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from devtools import sandbox
from devtools.sandbox import SandboxError, SlurmNode

# ---------------------------------------------------------------------------------------------------------
# Pure: slurm.conf and the environment that points at it.


def test_render_slurm_conf() -> None:
    nodes = [SlurmNode("node-0", "127.0.0.2", 7002), SlurmNode("node-1", "127.0.0.3", 7003)]
    lines = sandbox.render_slurm_conf(Path("/s/slurm"), 7001, nodes).splitlines()
    for line in [
        "SlurmctldHost=localhost(127.0.0.1)",
        "SlurmctldPort=7001",
        "AuthType=auth/munge",
        "AuthInfo=socket=/s/slurm/munge.socket",
        "StateSaveLocation=/s/slurm/state",
        "SlurmdSpoolDir=/s/slurm/%n",
        "SlurmdPidFile=/s/slurm/slurmd-%n.pid",
        "SlurmdLogFile=/s/slurm/log/slurmd-%n.log",
        "SlurmctldLogFile=/s/slurm/log/slurmctld.log",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SelectType=select/cons_tres",
        "ReturnToService=2",
        "SlurmUser=root",
        "KillWait=5",
        "NodeName=node-0 NodeAddr=127.0.0.2 Port=7002 CPUs=2 State=UNKNOWN",
        "NodeName=node-1 NodeAddr=127.0.0.3 Port=7003 CPUs=2 State=UNKNOWN",
        "PartitionName=main Nodes=node-[0-1] Default=YES MaxTime=INFINITE State=UP",
    ]:
        assert line in lines
    one = sandbox.render_slurm_conf(Path("/s/slurm"), 7001, nodes[:1]).splitlines()
    assert "PartitionName=main Nodes=node-0 Default=YES MaxTime=INFINITE State=UP" in one


def test_render_slurm_conf_refuses_folders_slurm_would_misread() -> None:
    nodes = [SlurmNode("node-0", "127.0.0.2", 7002)]
    with pytest.raises(SandboxError, match="plain characters"):
        sandbox.render_slurm_conf(Path("/a b/slurm"), 7001, nodes)
    too_long = "is too long for SLURM: a unix socket under it would take 126 of at most 107 characters"
    with pytest.raises(SandboxError, match=too_long):
        sandbox.render_slurm_conf(Path("/" + "x" * 90 + "/slurm"), 7001, nodes)
    # The spool holds the steps' sockets (a batch step's id is 4294967291): a short folder of its own.
    long_state = Path("/" + "x" * 80 + "/slurm")
    conf = sandbox.render_slurm_conf(long_state, 7001, nodes, spool=Path("/tmp/launcher-slurm-0123456789ab"))
    assert "SlurmdSpoolDir=/tmp/launcher-slurm-0123456789ab/%n" in conf.splitlines()
    with pytest.raises(SandboxError, match="too long for SLURM"):
        sandbox.render_slurm_conf(long_state, 7001, nodes)


def test_slurm_env_points_at_the_state_folder() -> None:
    assert sandbox.slurm_env(Path("/s")) == {"SLURM_CONF": "/s/slurm/slurm.conf"}
    assert sandbox.slurm_conf_path(Path("/s")) == Path("/s/slurm") / sandbox.SLURM_CONF_NAME


def test_load_reads_state_files_without_slurm(tmp_path: Path) -> None:
    node = {"name": "node-0", "addr": "127.0.0.2", "port": 2222, "pid": 1, "start_time": 1}
    paths = {key: str(tmp_path / key) for key in ("ssh_config", "known_hosts", "identity_file", "inventory")}
    state = {"state_dir": str(tmp_path), **paths, "nodes": [node]}  # as written before SLURM, or without it
    (tmp_path / "sandbox.json").write_text(json.dumps(state))
    assert sandbox.load(tmp_path).slurm_conf is None


# ---------------------------------------------------------------------------------------------------------
# Real: munged, slurmctld and a slurmd per node.


