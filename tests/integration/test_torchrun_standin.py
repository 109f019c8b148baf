"""The tests' stand-in torchrun (tests/support/torchrun_standin) against the real one, on what the launcher reads:
the workers' environment and their files, the exit code and the root-cause block of a failed rank, the death-signal
lines of a stopped node, and the static rendezvous's order (no worker before every node joined, node 0 last to end);
and a torch job forms its process group under the stand-in (whose rank 0 serves the group's store: the one name that
differs, TORCHELASTIC_USE_AGENT_STORE, with MASTER_PORT). Where torch changes one of these, this test fails, not the
tests that run the stand-in."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launcher.plan.ends import failed_rank, root_cause_block
from tests.conftest import STAND_IN_ENV, free_port
from tests.helpers import wait_for

pytestmark = pytest.mark.integration

WORKER = """\
import os, signal, sys, time
names = sorted(k for k in os.environ if k not in set(os.environ["BASE_NAMES"].split(",")))
print("ENV " + " ".join(f"{k}={os.environ[k]}" for k in names), flush=True)
print("on stderr", file=sys.stderr, flush=True)
def said(signum, frame):
    print(f"got {signum}", flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, said)
signal.signal(signal.SIGINT, said)
mode, rank = sys.argv[1], os.environ["RANK"]
open(os.path.join(sys.argv[2], f"started-{rank}"), "w").close()
if mode == "fail" and rank == "1":
    time.sleep(0.5)
    sys.exit(3)
time.sleep({"fail": 60, "sleep": 60}.get(mode, float(sys.argv[3]) if len(sys.argv) > 3 else 0))
open(os.path.join(sys.argv[2], f"ended-{rank}"), "w").close()
"""

KINDS = ("real", "stand-in")


def _torchrun(kind: str, tmp: Path, mode: str, *, nnodes: int = 1, node_rank: int = 0, nproc: int = 2,
              port: int, extra: tuple[str, ...] = (), job: str = WORKER) -> subprocess.Popen:
    """One node's torchrun of `job` (WORKER: its argv the mode, the marks' folder and `extra`), --redirects 3 into
    `tmp`/logs-<node rank>."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if kind == "stand-in":
        env.update(STAND_IN_ENV)
    env["BASE_NAMES"] = ",".join([*env, "BASE_NAMES"])
    (tmp / "worker.py").write_text(job)
    marks = tmp / "marks"
    marks.mkdir(exist_ok=True)
    argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nnodes), "--node-rank", str(node_rank),
            "--nproc-per-node", str(nproc), "--master-addr", "127.0.0.1", "--master-port", str(port),
            "--redirects", "3", "--log-dir", str(tmp / f"logs-{node_rank}"), str(tmp / "worker.py"), mode,
            str(marks), *extra]
    return subprocess.Popen(argv, env=env, cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def _worker_files(tmp: Path, node_rank: int = 0) -> dict[str, str]:
    """{local rank/file: text} under the log dir, the `<run id>_<random>` folder's name left out."""
    root = tmp / f"logs-{node_rank}"
    (run_folder,) = root.iterdir()
    assert run_folder.name.startswith("none_") and len(run_folder.name) == len("none_") + 8, run_folder.name
    return {str(path.relative_to(run_folder)): path.read_text() for path in sorted(run_folder.rglob("*.log"))}


def _env_of(files: dict[str, str], local_rank: int) -> dict[str, str]:
    line = next(x for x in files[f"attempt_0/{local_rank}/stdout.log"].splitlines() if x.startswith("ENV "))
    env = dict(part.split("=", 1) for part in line[4:].split(" "))
    env["TORCHELASTIC_ERROR_FILE"] = "/".join(env["TORCHELASTIC_ERROR_FILE"].split("/")[-3:])  # attempt_0/N/error.json
    return env


def _run_each(tmp_path: Path, mode: str, sig: signal.Signals | None = None
              ) -> dict[str, tuple[int, list[str], dict[str, str]]]:
    """{kind: (exit code, output lines, the workers' files)} of one single-node run of each torchrun; with `sig`,
    sent once both workers started."""
    ran = {}
    for kind in KINDS:
        tmp = tmp_path / kind
        tmp.mkdir()
        proc = _torchrun(kind, tmp, mode, port=free_port())
        if sig is not None:
            marks = tmp / "marks"
            wait_for(lambda: len(list(marks.glob("started-*"))) == 2, 60, "both workers started")  # noqa: B023
            proc.send_signal(sig)
        out, _ = proc.communicate(timeout=120)
        ran[kind] = (proc.returncode, out.splitlines(), _worker_files(tmp))
    return ran


def test_workers_get_torchruns_environment_and_files(tmp_path: Path) -> None:
    seen = {}
    for kind, (code, lines, files) in _run_each(tmp_path, "ok").items():
        envs = [_env_of(files, r) for r in (0, 1)]
        for env in envs:
            env.pop("MASTER_PORT")  # each run its own: torchrun's store, the stand-in's rank 0's
            seen.setdefault("stores", []).append(env.pop("TORCHELASTIC_USE_AGENT_STORE"))
        seen[kind] = (code, sorted(files), envs, files["attempt_0/1/stderr.log"],
                      any("Setting OMP_NUM_THREADS environment variable for each process to be 1" in x for x in lines))
    assert seen["stand-in"] == seen["real"]
    assert seen["real"][0] == 0 and seen["real"][4]
    assert seen["stores"] == ["True", "True", "False", "False"]  # who serves the group's store: torchrun, or rank 0


def test_a_failed_rank_is_the_same_root_cause(tmp_path: Path) -> None:
    seen = {}
    for kind, (code, lines, files) in _run_each(tmp_path, "fail").items():
        failed = next(line.split("] ", 1)[1] for line in lines if "failed (exitcode" in line)
        seen[kind] = (code, failed_rank(root_cause_block(lines)), sum("closing signal SIGTERM" in x for x in lines),
                      failed.split(" (pid")[0], "got 15" in files["attempt_0/0/stdout.log"], lines[-1] == "=" * 60,
                      any(x.startswith("torch.distributed.elastic.multiprocessing.errors.ChildFailedError")
                          for x in lines))
    assert seen["stand-in"] == seen["real"] == (1, (1, 1, 3), 1, "failed (exitcode: 3) local_rank: 1", True, True,
                                                True)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_death_signal_closes_the_workers_with_it(tmp_path: Path, sig: signal.Signals) -> None:
    seen = {}
    for kind, (code, lines, files) in _run_each(tmp_path, "sleep", sig).items():
        said = [line.split("] ", 1)[1] for line in lines if "] " in line and line[:1] in "WE"]
        seen[kind] = (code, said[0], sum(f"closing signal {sig.name}" in x for x in said), lines[-1].split(":")[0],
                      [f"got {int(sig)}" in files[f"attempt_0/{r}/stdout.log"] for r in (0, 1)])
    assert seen["stand-in"] == seen["real"] == (
        1, f"Received {int(sig)} death signal, shutting down workers", 2,
        "torch.distributed.elastic.multiprocessing.api.SignalException", [True, True])


def test_two_nodes_start_their_workers_together_and_node_0_ends_last(tmp_path: Path) -> None:
    """Node 1 starts first and waits for node 0; node 1's workers end 3 s after node 0's, and node 0's torchrun waits
    for them (the exit barrier)."""
    seen = {}
    for kind in KINDS:
        tmp = tmp_path / kind
        tmp.mkdir()
        port = free_port()
        second = _torchrun(kind, tmp, "ok", nnodes=2, node_rank=1, nproc=1, port=port, extra=("3",))
        time.sleep(3)
        started_alone = sorted(p.name for p in (tmp / "marks").iterdir())
        first = _torchrun(kind, tmp, "ok", nnodes=2, node_rank=0, nproc=1, port=port, extra=("0",))
        first_out, _ = first.communicate(timeout=120)
        first_ended = time.time()
        second_out, _ = second.communicate(timeout=120)
        # node 0's torchrun ended only once node 1's worker had (3 s after its own): the exit barrier
        waited = (tmp / "marks" / "ended-1").stat().st_mtime <= first_ended
        seen[kind] = (started_alone, first.returncode, second.returncode, waited,
                      sorted(p.name for p in (tmp / "marks").iterdir()))
        if second.returncode or first.returncode:
            raise AssertionError(first_out + second_out)
    assert seen["stand-in"] == seen["real"] == ([], 0, 0, True, ["ended-0", "ended-1", "started-0", "started-1"])


GROUP = """\
import os, torch, torch.distributed as dist
dist.init_process_group("gloo")
total = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(total)
print(f"rank {dist.get_rank()} of {dist.get_world_size()}: {total.item():g}", flush=True)
dist.destroy_process_group()
"""


def test_a_torch_job_forms_its_group_across_two_nodes_under_the_stand_in(tmp_path: Path) -> None:
    """Rank 0's worker serves the group's store (torchrun serves its own, which needs torch), on the port node 0
    told node 1: a job that imports torch and joins a group runs under the stand-in as under torchrun."""
    port = free_port()
    nodes = [_torchrun("stand-in", tmp_path, "group", nnodes=2, node_rank=n, nproc=1, port=port, job=GROUP)
             for n in (1, 0)]
    outs = [node.communicate(timeout=120)[0] for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], outs
    said = [_worker_files(tmp_path, n)["attempt_0/0/stdout.log"] for n in (0, 1)]
    assert "rank 0 of 2: 3" in said[0] and "rank 1 of 2: 3" in said[1], said
