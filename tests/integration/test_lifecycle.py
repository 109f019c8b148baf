"""A run's lifecycle on real sshd nodes: Ctrl-C, a killed launcher, fail fast, detach, stop, status, logs."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from devtools.observe import free_port
from tests.helpers import inv, inv_background, run_id_of, run_processes, wait_for

pytestmark = pytest.mark.integration


def started_run(out: Path, workers: int, timeout: float = 60) -> str:
    """Wait until the launch written to `out` has `workers` processes printing; return its run id."""
    def ready() -> bool:
        text = out.read_text(errors="replace")
        return "started" in text and text.count("tick 0") >= workers

    wait_for(ready, timeout)
    return run_id_of(out.read_text())


@pytest.fixture
def sleeper_box(make_sandbox):
    return make_sandbox(2, torchrun="stand-in",
                        master_port=free_port(), script="tests/scripts/sleeper.py", script_args=["0.2"])


def test_ctrl_c_stops_the_run_on_every_node(sleeper_box, tmp_path: Path) -> None:
    """Ctrl-C stops every node's part; the console says so in one line a node, where torchrun's own lines on it
    (`Received 15 death signal`, its SignalException traceback) are, which its copy of the node's log keeps."""
    out = tmp_path / "launch.out"
    proc = inv_background("launch", "--hosts", str(sleeper_box.inventory), log_dir=tmp_path / "logs", out=out)
    run_id = started_run(out, workers=2)
    assert len(run_processes(run_id)) >= 4  # torchrun and its worker on each node
    t0 = time.monotonic()
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal sends on Ctrl-C
    assert proc.wait(timeout=15) == 130
    assert time.monotonic() - t0 < 15
    assert run_processes(run_id) == []
    said = out.read_text()
    assert "stopping the run on every node" in said
    after = said[said.index("stopping the run on every node"):].splitlines()
    for node in ("node-0", "node-1"):
        own = [line for line in after if line.startswith(f"{node}     | ")]  # torchrun's, not a rank's
        kept = (tmp_path / "logs" / run_id / f"{node}.log").read_text()
        assert "Received 15 death signal" in kept, kept[-2000:] + "\n=====\n" + said  # every line stays in the logs
        where = re.escape(f"{tmp_path / 'logs' / run_id}/{node}.log")
        assert len(own) == 1 and re.fullmatch(rf"{node}     \| stopped as asked; torchrun's \d+ line\(s\) on it "
                                              rf"\(its signal, its traceback\) are in {where}", own[0]), said
    assert "death signal" not in said and "SignalException" not in said
    status = inv("status", "--hosts", str(sleeper_box.inventory), "--run", run_id)  # who stopped it (issue 69, 13)
    assert "stopped by the user (Ctrl-C in its launcher)" in status.stdout, status.stdout


def test_an_attached_run_stopped_from_another_terminal_ends_as_stopped(sleeper_box, tmp_path: Path) -> None:
    """`inv stop` from elsewhere ends an attached launch as stopped (exit 143, the stop named), never as a failure
    whose root cause is the stop's own exit code 143 or 137."""
    out = tmp_path / "launch.out"
    proc = inv_background("launch", "--hosts", str(sleeper_box.inventory), log_dir=tmp_path / "logs", out=out)
    run_id = started_run(out, workers=2)
    stopped = inv("stop", "--hosts", str(sleeper_box.inventory), "--run", run_id, timeout=60)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert proc.wait(timeout=30) == 143
    said = out.read_text()
    assert f"run {run_id} was stopped from elsewhere (`inv stop`) on 2 node(s)" in said, said
    assert "FAILED" not in said and "root cause" not in said, said
    assert run_processes(run_id) == []


def test_detached_run_survives_the_launcher_and_is_stopped_by_inv_stop(sleeper_box, tmp_path: Path) -> None:
    hosts = str(sleeper_box.inventory)
    decoy = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "torchrun", "sleeper.py"])
    run_id = None
    try:
        result = inv("launch", "--hosts", hosts, "--detach", log_dir=tmp_path / "logs", timeout=60)
        assert result.returncode == 0, result.stderr
        run_id = run_id_of(result.stderr)
        assert "detached" in result.stderr
        wait_for(lambda: len(run_processes(run_id)) >= 4, timeout=30)

        running = inv("status", "--hosts", hosts, "--run", run_id)
        assert running.returncode == 0, running.stderr
        assert running.stdout.count("running") == 2 and run_id in running.stdout, running.stdout

        follow = subprocess.Popen([sys.executable, "-m", "invoke", "logs", "--hosts", hosts, "--follow",
                                   "--node", "node-1"], cwd=Path(__file__).parents[2],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        first = follow.stdout.readline()  # a line arrives while the run is still going
        assert first.startswith("node-1"), first
        time.sleep(1)

        stopped = inv("stop", "--hosts", hosts, timeout=60)
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        assert run_processes(run_id) == []
        rest, errors = follow.communicate(timeout=30)  # --follow ends when the run does, and says how
        assert "tick" in rest and "node-0" not in rest, rest + errors
        assert re.search(rf"run {run_id} ended: node-1 stopped by the user \(\S+@\S+ \(pid \d+\), from another "
                         r"terminal\) \(exit code \d+\)", errors), errors
        assert decoy.poll() is None, "inv stop killed a process that only looked like a torchrun"

        again = inv("stop", "--hosts", hosts, timeout=60)
        assert again.returncode == 0
        assert "nothing was running" in again.stdout

        after = inv("status", "--hosts", hosts, "--run", run_id)
        assert after.stdout.count("│ stopped") == 2, after.stdout  # each node's state, and who (below)
        assert re.search(r"stopped by the user \(\S+@\S+ \(pid \d+\), from another terminal\)",
                         after.stdout), after.stdout
    finally:
        decoy.kill()
        decoy.wait()
        if run_id is not None and run_processes(run_id):  # a detached run outlives its sandbox: stop it here
            inv("stop", "--hosts", hosts, "--run", run_id, timeout=60)


class Logins:
    """Each node's login shell (one a session) leaves a line in its own file: `rc` is the nodes' login rc."""

    def __init__(self, tmp_path: Path):
        self.folder = tmp_path / "shells"
        self.folder.mkdir()
        self.rc = f'echo "$$" >> {self.folder}/"$(hostname)"\n'

    def counts(self) -> dict[str, int]:
        return {p.name: len(p.read_text().splitlines()) for p in self.folder.iterdir()}

    def since(self, before: dict[str, int]) -> dict[str, int]:
        return {name: count - before.get(name, 0) for name, count in self.counts().items()}


def test_stop_without_run_chooses_and_stops_in_one_session_a_node(make_sandbox, tmp_path: Path) -> None:
    logins = Logins(tmp_path)
    box = make_sandbox(2, torchrun="stand-in",
                       master_port=free_port(), script="tests/scripts/sleeper.py", script_args=["0.2"],
                       login_rc=logins.rc)
    hosts = str(box.inventory)
    data = yaml.safe_load(box.inventory.read_text())
    data["retries"], data["job"]["on_hang"] = 1, "restart"  # what no launcher does for a detached run: said
    box.inventory.write_text(yaml.safe_dump(data))
    result = inv("launch", "--hosts", hosts, "--detach", log_dir=tmp_path / "logs", timeout=60)
    assert result.returncode == 0, result.stderr
    unwatched = (f"note: {hosts}: job.on_hang: restart does not apply to a detached run: no launcher watches it for "
                 "a hang")
    assert unwatched in result.stderr and "retries: 1 does not apply to a detached run" in result.stderr
    run_id = run_id_of(result.stderr)
    try:
        wait_for(lambda: len(run_processes(run_id)) >= 4, timeout=30)
        status = inv("status", "--hosts", hosts, "--run", run_id, timeout=60)
        assert unwatched in " ".join(status.stdout.split()), status.stdout  # rich wraps it
        before = logins.counts()
        stopped = inv("stop", "--hosts", hosts, timeout=60)
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        assert f"run {run_id}: the run of {hosts} that is running (no --run given)" in stopped.stderr
        assert stopped.stdout.count("│ stopped │") == 2, stopped.stdout
        assert logins.since(before) == {"node-0": 1, "node-1": 1}  # the listing and the stop in one login
        assert run_processes(run_id) == []
    finally:
        if run_processes(run_id):
            inv("stop", "--hosts", hosts, "--run", run_id, timeout=60)


def test_status_and_logs_of_a_finished_run(make_sandbox, tmp_path: Path) -> None:
    logins = Logins(tmp_path)
    box = make_sandbox(2, torchrun="stand-in",
                       master_port=free_port(), script="tests/scripts/echo_args.py", script_args=["x"],
                       login_rc=logins.rc)
    hosts = str(box.inventory)
    # Sandbox nodes share this machine's home, so "latest" may be another test's run: ask for an unknown id.
    before = inv("status", "--hosts", hosts, "--run", "20000101-000000-000000")
    assert before.returncode == 0 and before.stdout.count("none") == 2, before.stdout
    (tmp_path / "echo").mkdir()
    data = yaml.safe_load(box.inventory.read_text())
    data["defaults"]["env"] = {"ECHO_OUT_DIR": str(tmp_path / "echo")}
    box.inventory.write_text(yaml.safe_dump(data))
    launched = inv("launch", "--hosts", hosts, log_dir=tmp_path / "logs")
    assert launched.returncode == 0, launched.stderr
    run_id = run_id_of(launched.stderr)
    status = inv("status", "--hosts", hosts, "--run", run_id)
    assert status.stdout.count("exited") == 2, status.stdout
    before = logins.counts()
    chosen = inv("status", "--hosts", hosts)  # no --run: this inventory's run, from one session a node
    assert chosen.returncode == 0 and chosen.stdout.count("exited") == 2, chosen.stdout + chosen.stderr
    assert run_id in chosen.stdout + chosen.stderr
    assert logins.since(before) == {"node-0": 1, "node-1": 1}
    replay = inv("logs", "--hosts", hosts, "--run", run_id, "--rank", "1")
    assert replay.returncode == 0, replay.stderr
    assert "node-1 r1" in replay.stdout and "echoed rank 1 of 2 on node-1" in replay.stdout
    assert "node-0" not in replay.stdout


def test_a_rank_that_raises_fails_the_run_fast_with_its_exception(make_sandbox, tmp_path: Path) -> None:
    box = make_sandbox(2, nproc_per_node=1, master_port=free_port())
    t0 = time.monotonic()
    result = inv("launch", "--hosts", str(box.inventory), "--script", "train/ddp.py", "--args",
                 "--epochs 50 --dataset-size 256 --batch-size 8 --sleep-per-step 0.05 --fail-at 5 --fail-rank 1",
                 log_dir=tmp_path / "logs", timeout=120)
    elapsed = time.monotonic() - t0
    assert result.returncode != 0
    assert elapsed < 60
    assert ("root cause: node-1, rank 1 (local rank 0), exit code 1: RuntimeError: injected failure at step 5 on "
            "rank 1") in result.stderr, result.stderr
    assert "To enable traceback" not in result.stderr  # torchrun's placeholder: the exception stands there
    assert "node-0: exit code" in result.stderr and "(stopped by the launcher)" in result.stderr, result.stderr
    assert run_processes(run_id_of(result.stderr)) == []


NO_NUMPY = """import os, time
import torch
import torch.distributed as dist
print(f"rank {os.environ['RANK']} up", flush=True)
dist.init_process_group("gloo")
if dist.get_rank() == 1:
    torch.zeros(2).numpy()
time.sleep(60)
"""


def test_the_root_cause_of_a_rank_with_warnings_is_its_exception_not_the_warnings(make_sandbox, tmp_path: Path
                                                                                   ) -> None:
    """The nodes' venv has no numpy (as a user's may not): torch warns `Failed to initialize NumPy` in every rank,
    then rank 1 raises. The summary shows its exception and the line that raised it, never the warnings."""
    script = tmp_path / "no_numpy.py"
    script.write_text(NO_NUMPY)
    box = make_sandbox(1, nproc_per_node=2, master_port=free_port(), script=str(script))
    result = inv("launch", "--hosts", str(box.inventory), log_dir=tmp_path / "logs", timeout=120)
    assert result.returncode == 1, result.stderr
    summary = result.stderr[result.stderr.index("FAILED"):].splitlines()
    assert summary[1] == ("root cause: node-0, rank 1 (local rank 1), exit code 1: RuntimeError: Numpy is not "
                          "available"), result.stderr
    at = summary.index("  exception : RuntimeError: Numpy is not available")
    assert summary[at + 1:at + 3] == [f'  raised at : File "{script}", line 7, in <module>',
                                      "              torch.zeros(2).numpy()"], result.stderr
    assert not any("Warning" in line or "To enable traceback" in line for line in summary), result.stderr
    assert "UserWarning: Failed to initialize NumPy" in result.stdout  # the console streamed them as they came


def test_stop_without_run_stops_this_inventorys_run_and_never_anothers(make_sandbox, tmp_path: Path) -> None:
    """Run A on node-0 and node-1, run B on node-1 and node-2, run C on node-1 alone (within A's hosts): `inv stop
    --hosts A.yaml` stops A, not B or C on node-1: each run records the inventory it was started from."""
    box = make_sandbox(3, torchrun="stand-in", script="tests/scripts/sleeper.py", script_args=["0.5"])
    base = yaml.safe_load(box.inventory.read_text())

    def inventory(name: str, hosts: list[str]) -> str:
        data = {**base, "hosts": hosts, "rendezvous": {"master_addr": hosts[0], "master_port": free_port()}}
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        return str(path)

    a, b, c = inventory("A", ["node-0", "node-1"]), inventory("B", ["node-1", "node-2"]), inventory("C", ["node-1"])
    started: list[str] = []
    try:
        for hosts in (a, b, c):
            result = inv("launch", "--hosts", hosts, "--detach", log_dir=tmp_path / "logs", timeout=60)
            assert result.returncode == 0, result.stdout + result.stderr
            started.append(run_id_of(result.stderr))
        run_a, run_b, run_c = started
        time.sleep(1)  # B and C are newer runs on node-1: what each node alone used to pick

        stopped = inv("stop", "--hosts", a, timeout=60)
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        assert f"run {run_a}: the run of {a} that is running (no --run given)" in stopped.stderr
        assert run_processes(run_a) == []
        assert {p.split("/")[1] for p in marks_of(run_b)} == {"node-1", "node-2"}, "B must still run on both nodes"
        assert {p.split("/")[1] for p in marks_of(run_c)} == {"node-1"}, "C must still run"

        # Two runs of one inventory (its file given another port in between): which one is meant is not guessed.
        Path(b).write_text(Path(b).read_text().replace(str(yaml.safe_load(Path(b).read_text())["rendezvous"]
                                                           ["master_port"]), str(free_port())))
        again = inv("launch", "--hosts", b, "--detach", log_dir=tmp_path / "logs", timeout=60)
        assert again.returncode == 0, again.stdout + again.stderr
        started.append(run_id_of(again.stderr))
        refused = inv("stop", "--hosts", b, timeout=60)
        assert refused.returncode == 1, refused.stdout + refused.stderr
        assert (f"error: 2 runs of {b} are running: {run_b} (running on node-1, node-2); {started[3]} (running on "
                "node-1, node-2); name one with --run") in refused.stderr, refused.stderr
        assert run_processes(run_b) and run_processes(started[3])
    finally:
        for run_id in started:
            if run_processes(run_id):
                inv("stop", "--hosts", str(box.inventory), "--run", run_id, timeout=60)
    assert all(run_processes(r) == [] for r in started)


def marks_of(run_id: str) -> set[str]:
    """The run marks (`<run id>/<node>`) its live processes carry."""
    found = set()
    for pid in run_processes(run_id):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        found |= {v.split(b"=", 1)[1].decode() for v in env if v.startswith(b"DDP_LAUNCHER_RUN=")}
    return found


def test_status_and_stop_are_bounded_by_their_limits_when_a_node_stops_answering(sleeper_box, tmp_path: Path,
                                                                                 monkeypatch) -> None:
    from devtools.observe import signal_each, sshd_family

    hosts = str(sleeper_box.inventory)
    result = inv("launch", "--hosts", hosts, "--detach", log_dir=tmp_path / "logs", timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    run_id = run_id_of(result.stderr)
    stopped = signal_each(sshd_family(sleeper_box.nodes[1].pid), signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        quick = {"INVOKE_LAUNCHER_CONNECT_TIMEOUT": "2"}
        status = inv("status", "--hosts", hosts, "--run", run_id, env=quick, timeout=60)
        took = time.monotonic() - t0
        assert status.returncode == 1 and took < 2 + 6, (took, status.stdout + status.stderr)
        assert "node-1" in status.stdout and "unreachable" in status.stdout, status.stdout

        # Ctrl-C while it waits on the silent node: back at once, not after every thread's end.
        out = tmp_path / "status.out"
        monkeypatch.setenv("INVOKE_LAUNCHER_CONNECT_TIMEOUT", "30")
        proc = inv_background("status", "--hosts", hosts, "--run", run_id, log_dir=tmp_path / "logs", out=out)
        monkeypatch.delenv("INVOKE_LAUNCHER_CONNECT_TIMEOUT")
        time.sleep(2)
        t0 = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=30)
        assert time.monotonic() - t0 < 3, out.read_text()

        t0 = time.monotonic()  # without --run: the choice from the nodes that answer, within the same bounds
        chosen = inv("stop", "--hosts", hosts, env=quick, timeout=60)
        took = time.monotonic() - t0
        assert chosen.returncode == 1 and took < 2 + 6 + 1, (took, chosen.stdout + chosen.stderr)
        assert "node-1" in chosen.stdout and "unreachable" in chosen.stdout, chosen.stdout
        assert "│ node-0 │" in chosen.stdout and "stopped" in chosen.stdout.split("│ node-0 │")[1].split("\n")[0], \
            chosen.stdout

        t0 = time.monotonic()
        stop = inv("stop", "--hosts", hosts, "--run", run_id, env=quick, timeout=60)
        took = time.monotonic() - t0
        assert stop.returncode == 1 and took < 2 + 6 + 1, (took, stop.stdout + stop.stderr)
        assert "Traceback" not in stop.stdout + stop.stderr
    finally:
        signal_each(stopped, signal.SIGCONT)
    final = inv("stop", "--hosts", hosts, "--run", run_id, timeout=60)
    assert final.returncode == 0, final.stdout + final.stderr
    assert run_processes(run_id) == []
