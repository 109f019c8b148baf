"""The trainers people use, on sandbox nodes: Lightning and Hugging Face's `Trainer`, 2 nodes x 2 ranks, CPU and
gloo, tiny models built from a config (nothing downloaded). Software nobody here wrote: what the launcher sees of
their runs (progress, stragglers, hangs) must hold for them as it does for train/ddp.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from bench.observe import free_port
from tests.helpers import inv, run_id_of, run_processes, wait_for
from tests.support.nodeenv import trainers_env

pytestmark = pytest.mark.integration

LIGHTNING = "tests/scripts/lightning_boring.py"
HF = "tests/scripts/hf_trainer.py"


def _box(make_sandbox, script: str, **env: str):
    """2 nodes x 2 ranks under the declared env with the trainers extra; `env` for the job's knobs."""
    box = make_sandbox(2, nproc_per_node=2, master_port=free_port(), script=script, python=str(trainers_env().python))
    if env:
        data = yaml.safe_load(box.inventory.read_text())
        data["defaults"]["env"] = {**data["defaults"].get("env", {}), **env}
        box.inventory.write_text(yaml.safe_dump(data, sort_keys=False))
    return box


@pytest.mark.parametrize("script", [LIGHTNING, HF])
def test_a_trainer_runs_to_its_end_on_every_rank(make_sandbox, tmp_path: Path, script: str) -> None:
    box = _box(make_sandbox, script)
    launched = inv("launch", "--hosts", str(box.inventory), log_dir=tmp_path / "logs", timeout=300)
    assert launched.returncode == 0, launched.stdout[-3000:] + launched.stderr[-3000:]
    done = sorted(line.split("| ", 1)[1].split()[2] for line in launched.stdout.splitlines() if "| done rank" in line)
    assert done == ["0", "1", "2", "3"], launched.stdout[-3000:]
    run_id = run_id_of(launched.stderr)
    wait_for(lambda: run_processes(run_id) == [], 30, "every process of the run gone")
