"""The job in a container on every node (`container:`), on real sshd nodes with a real runtime (Debian's podman, as
root here; each node its own storage): one world, the same weights, and nothing of the run left, container or
process, however it ended."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from devtools.observe import free_port
from tests._train_helpers import assert_replicas_in_sync
from tests.helpers import inv, run_id_of, run_processes
from tests.support import containers as ct
from tests.support import podman as pm

pytestmark = pytest.mark.integration

WHY_NOT = pm.unavailable()
if WHY_NOT is not None:
    pytest.skip(WHY_NOT, allow_module_level=True)

TRAIN = "--epochs 1 --dataset-size 128 --batch-size 16 --log-every 2"


@pytest.fixture
def nodes(make_sandbox, tmp_path: Path) -> Iterator[ct.ContainerNodes]:
    made = None
    try:
        made = ct.container_nodes(make_sandbox, tmp_path, nproc_per_node=2, master_port=free_port())
        yield made
    finally:
        ct.discard(made)


def test_ddp_in_the_image_on_two_nodes_is_one_world_and_leaves_no_container(nodes, tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    whole = inv("launch", "--hosts", str(nodes.sandbox.inventory), "--script", "train/ddp.py", "--args", TRAIN,
                log_dir=logs)
    assert whole.returncode == 0, whole.stdout + whole.stderr
    assert_replicas_in_sync(whole.stdout, world_size=4)
    run_id = run_id_of(whole.stderr)
    assert run_processes(run_id) == []
    assert nodes.left() == {}
    for i in range(2):
        run_dir = next(nodes.sandbox.state_dir.glob(f"node-{i}/cache/ddp-launcher/runs/{run_id}/node-{i}"))
        assert (run_dir / "container.json").exists() and (run_dir / "container_started").exists()
