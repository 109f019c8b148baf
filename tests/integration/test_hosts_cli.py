"""`--hosts` takes a DeepSpeed/MPI hostfile for every task (settings from invoke.yaml's `launcher.defaults` and
`launcher.job`); `--include`/`--exclude` choose hosts and GPUs on launch and doctor.

Wrong input is found before anything connects; one real launch on sandbox nodes runs exactly the ranks asked for.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.helpers import inv, run_id_of
from tests.support.hostfiles import config_file

# --- the cluster every task loads -------------------------------------------------------------------------------


# --- the command line: one sentence, exit 2, nothing contacted -----------------------------------------------------


# --- on real sshd nodes --------------------------------------------------------------------------------------------

RANKS = """import json, os, socket
keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "CUDA_VISIBLE_DEVICES")
print("ranks " + json.dumps({k: os.environ.get(k) for k in keys} | {"host": socket.gethostname()}), flush=True)
"""


@pytest.mark.integration
def test_a_hostfile_and_include_run_the_ranks_asked_for_no_more(make_sandbox, tmp_path: Path) -> None:
    box = make_sandbox(2)
    inventory = yaml.safe_load(box.inventory.read_text())
    script = tmp_path / "ranks.py"
    script.write_text(RANKS)
    hosts = tmp_path / "hostfile"
    hosts.write_text("node-0 slots=2\nnode-1 slots=2   # two GPUs each\n")
    # A hostfile says names and slots; how to reach the nodes (the sandbox's own ssh config, with its known_hosts)
    # and what runs there come from launcher.defaults and launcher.job.
    conf = config_file(tmp_path, {**inventory["defaults"], "ssh_config": str(box.ssh_config)},
                       {"script": str(script)})

    result = inv("-f", str(conf), "launch", "--hosts", str(hosts), "--include", "node-0:1@node-1",
                 log_dir=tmp_path / "logs")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "started 2/2" in result.stderr
    printed = [json.loads(line.split("ranks ", 1)[1]) for line in result.stdout.splitlines() if "| ranks " in line]
    assert sorted((p["RANK"], p["host"], p["LOCAL_RANK"], p["CUDA_VISIBLE_DEVICES"]) for p in printed) == [
        ("0", "node-0", "0", "1"), ("1", "node-1", "0", None), ("2", "node-1", "1", None)]
    assert {p["WORLD_SIZE"] for p in printed} == {"3"}

    # status reads the same hostfile and settings (every task loads hosts the same way)
    status = inv("-f", str(conf), "status", "--hosts", str(hosts), "--run", run_id_of(result.stderr))
    assert status.returncode == 0 and status.stdout.count("exited") == 2, status.stdout + status.stderr
