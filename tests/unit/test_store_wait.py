"""torchrun on a node that joins another's rendezvous store waits for the store's port before torch tries it
(launcher/node/agent/storewait.py). The waiting program runs here in a real python against a real listener that comes up
late; a stand-in `torch.distributed.run` (on PYTHONPATH, no torch import) says when it ran and with which words."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from devtools.observe import free_port
from launcher.limits import NODE_TIMING
from launcher.node.agent.storewait import SOURCE, waiting_argv

TORCHRUN = ["/opt/py/bin/python", "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", "1", "train.py"]


def test_only_a_node_that_joins_the_store_waits():
    request = {"node_rank": 1, "master_addr": "node-0", "master_port": 29500}
    argv = waiting_argv(TORCHRUN, request, 60.0, 0.02)
    assert argv[:3] == ["/opt/py/bin/python", "-c", SOURCE]
    assert argv[3:7] == ["node-0", "29500", "60.0", "0.02"]
    assert argv[7:] == TORCHRUN[3:]
    assert waiting_argv(TORCHRUN, {**request, "node_rank": 0}, 60.0, 0.02) == TORCHRUN  # it holds the store
    other = ["/opt/py/bin/python", "train.py"]
    assert waiting_argv(other, request, 60.0, 0.02) == other  # not the launcher's torchrun: left as it is


@pytest.fixture
def stand_in(tmp_path: Path) -> Path:
    """A `torch.distributed.run` that prints the time it ran, its argv and whether it runs as __main__."""
    module = tmp_path / "torch" / "distributed"
    module.mkdir(parents=True)
    (tmp_path / "torch" / "__init__.py").write_text("")
    (module / "__init__.py").write_text("")
    (module / "run.py").write_text(
        "import sys, time\nprint(repr(time.time()), __name__, sys.argv[0].endswith('run.py'), *sys.argv[1:])\n")
    return tmp_path


def _run_waiting(stand_in: Path, host: str, port: int, limit: float) -> tuple[float, list[str]]:
    argv = waiting_argv([sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "train.py"],
                        {"node_rank": 1, "master_addr": host, "master_port": port}, limit, NODE_TIMING["store_poll_s"])
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30, env={"PYTHONPATH": str(stand_in)})
    assert done.returncode == 0, done.stderr
    ran_at, *printed = done.stdout.split()
    return float(ran_at), printed


def test_torchrun_runs_as_its_module_once_the_store_listens(stand_in: Path):
    port = free_port()
    listening: dict[str, float] = {}
    server = socket.socket()

    def listen_late() -> None:
        time.sleep(0.8)
        server.bind(("127.0.0.1", port))
        server.listen()
        listening["at"] = time.time()

    thread = threading.Thread(target=listen_late)
    thread.start()
    try:
        ran_at, argv = _run_waiting(stand_in, "127.0.0.1", port, 30.0)
    finally:
        thread.join()
        server.close()
    assert argv == ["__main__", "True", "--nnodes", "2", "train.py"]  # as `python -m` runs it, torchrun's words
    assert listening["at"] <= ran_at < listening["at"] + 0.5


def test_a_store_that_never_listens_is_waited_for_until_the_limit(stand_in: Path):
    began = time.time()
    ran_at, _ = _run_waiting(stand_in, "127.0.0.1", free_port(), 0.6)
    assert 0.6 <= ran_at - began < 5  # then torch's own retry and its own error


def test_an_address_that_does_not_resolve_ends_the_wait_at_once(stand_in: Path):
    began = time.time()
    ran_at, _ = _run_waiting(stand_in, "no-such-node.invalid", 29500, 30.0)
    assert ran_at - began < 5  # torchrun itself says the address is wrong, as without the wait
