"""examples/ddp_minimal.py, the script a newcomer copies, launched as its README says: 2 sandbox nodes x 1 process,
the real torchrun, the nodes' venv of declared dependencies only (no numpy). It trains, prints its loss, saves its
checkpoint, and a second launch with --resume (what `--retries` adds) goes on from the saved epoch."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from devtools.observe import free_port
from tests.conftest import SandboxFactory
from tests.helpers import inv, run_id_of, run_processes

pytestmark = pytest.mark.integration

SCRIPT = "examples/ddp_minimal.py"


@pytest.fixture(scope="module")
def example(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path, Path]]:
    """One sandbox for the module, whose inventory's job is the example for 2 epochs: (inventory, checkpoint dir,
    logs). The nodes share this machine's disk, as nodes on a shared file system do."""
    root = tmp_path_factory.mktemp("example")
    checkpoints = root / "checkpoints"
    factory = SandboxFactory(root)
    try:
        box = factory(2, master_port=free_port(), script=SCRIPT,
                      script_args=["--epochs", "2", "--checkpoint-dir", str(checkpoints)])
        yield box.inventory, checkpoints, root / "logs"
    finally:
        factory.close()


def launch(inventory: Path, logs: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    result = inv("launch", "--hosts", str(inventory), *extra, log_dir=logs, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert run_processes(run_id_of(result.stderr)) == []
    return result


def test_the_example_trains_on_two_nodes_and_saves_its_checkpoint(example: tuple[Path, Path, Path]) -> None:
    inventory, checkpoints, logs = example
    result = launch(inventory, logs)  # the inventory's job: script and args, as examples/README.md shows
    assert "started 2/2" in result.stderr
    assert re.search(r"^node-0 r0 +\| epoch 1 step 20 loss \d+\.\d{4}$", result.stdout, re.M), result.stdout
    assert not re.search(r"^node-1 .*\bloss\b", result.stdout, re.M), "rank 0 alone prints the loss"
    assert re.search(r"^node-0 r0 +\| checkpoint saved .* epoch 2$", result.stdout, re.M), result.stdout
    assert "Numpy is not available" not in result.stdout + result.stderr
    assert sorted(p.name for p in checkpoints.iterdir()) == ["checkpoint.pt"]  # written whole: no temp file left


def test_a_second_launch_with_resume_goes_on_from_the_saved_epoch(example: tuple[Path, Path, Path]) -> None:
    inventory, checkpoints, logs = example
    if not (checkpoints / "checkpoint.pt").exists():
        pytest.skip("the first launch saved no checkpoint (its own test says why)")
    result = launch(inventory, logs, "--args", f"--epochs 3 --checkpoint-dir {checkpoints} --resume")
    out = result.stdout
    assert re.search(r"^node-0 r0 +\| resumed from epoch 2$", out, re.M), out
    assert re.search(r"^node-0 r0 +\| epoch 2 step 40 loss ", out, re.M), out  # the step count goes on too
    assert not re.search(r"\| epoch [01] step ", out), "the saved epochs are not trained again"
    assert re.search(r"^node-0 r0 +\| checkpoint saved .* epoch 3$", out, re.M), out
