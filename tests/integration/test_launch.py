"""`inv launch` on a sandbox of real sshd nodes: one world across nodes, prefixed output, logs, failures."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from devtools import sandbox
from devtools.observe import free_port
from tests._train_helpers import (
    assert_replicas_in_sync,
    assert_state_dicts_close,
    assert_state_dicts_equal,
    load,
    run,
    single_cmd,
)
from tests.helpers import REPO, edit_inventory, inv, run_id_of, run_processes, runs_on

pytestmark = pytest.mark.integration

HOSTILE_ARGS = ["plain", "two words", "it's", 'say "hi"', "$(touch /tmp/launcher-pwned)", "`id`", "a;b", "x\ny",
                "ünïcödé ✓", "--flag=$HOME", "", "*", "\\", "-"]


TRAIN = "--epochs 2 --dataset-size 256 --batch-size 16 --log-every 2"


def own_train_workdirs(box: sandbox.Sandbox, tmp_path: Path) -> list[Path]:
    """Each sandbox node a workdir of its own (they share no disk) holding train/: ddp.py and the modules it imports."""
    data = yaml.safe_load(box.inventory.read_text())
    workdirs = [tmp_path / f"{name}-workdir" for name in data["hosts"]]
    for workdir in workdirs:
        (workdir / "train").mkdir(parents=True)
        for module in (REPO / "train").glob("*.py"):  # ddp.py and the modules it imports
            (workdir / "train" / module.name).write_bytes(module.read_bytes())
    data["hosts"] = [{"name": name, "workdir": str(w)} for name, w in zip(data["hosts"], workdirs, strict=True)]
    box.inventory.write_text(yaml.safe_dump(data, sort_keys=False))
    return workdirs


def assert_one_world_on_two_nodes(whole: subprocess.CompletedProcess[str], logs: Path) -> str:
    """Every rank reports from its own node: 4 ranks, one world, node-1 holds ranks 2 and 3; each node's log has its
    ranks' checksums and no process of the run is left. Returns the replicas' checksum."""
    out = whole.stdout
    for rank, node in [(0, "node-0"), (1, "node-0"), (2, "node-1"), (3, "node-1")]:
        assert re.search(rf"^{node} r{rank} +\| rank {rank}/4 .*host {node}", out, re.M), out
    checksum = assert_replicas_in_sync(out, world_size=4)
    run_id = run_id_of(whole.stderr)
    assert "connected 2/2" in whole.stderr and "started 2/2" in whole.stderr
    for node in ("node-0", "node-1"):
        assert (logs / run_id / f"{node}.log").read_text().count("CHECKSUM") == 2
    assert run_processes(run_id) == []
    return checksum


def test_ddp_across_two_nodes_is_one_world_and_resumes_exactly_with_or_without_rank_0s_checkpoint(
        make_sandbox, tmp_path: Path) -> None:
    """2 nodes x 2 processes through `inv launch`, each node its own workdir (they share no disk): one world, the
    single-process math, and an exact resume both where only node-0 has the checkpoint (node-1's ranks get its bytes
    over the group) and where every node has it (a shared disk's view: each rank reads its own copy).

    The nodes run the declared dependencies only (no numpy, tests/support/nodeenv.py), as a user's venv: the resume
    once used all_gather_object, which needs numpy in torch 2.13, and every rank failed on the first retry.
    """
    box = make_sandbox(2, nproc_per_node=2, master_port=free_port())
    workdirs = own_train_workdirs(box, tmp_path)
    logs = tmp_path / "logs"

    def launch(*extra: str) -> subprocess.CompletedProcess[str]:
        args = " ".join((TRAIN, "--checkpoint-dir ckpt", *extra))  # relative: each node's own workdir
        result = inv("launch", "--hosts", str(box.inventory), "--script", "train/ddp.py", "--args", args,
                     log_dir=logs)
        assert result.returncode == 0, result.stdout + result.stderr
        return result

    whole = launch(f"--save-weights {tmp_path / 'whole.pt'}")
    checksum = assert_one_world_on_two_nodes(whole, logs)

    # DDP is the math the guides promise: the same weights as one process taking the 4 ranks' batches per step.
    reference = run(single_cmd(*TRAIN.split(), "--reference-world-size", "4", "--save-weights",
                               str(tmp_path / "reference.pt")))
    assert reference.returncode == 0, reference.output
    assert_state_dicts_close(load(tmp_path / "whole.pt"), load(tmp_path / "reference.pt"), atol=1e-5)

    # Interrupted after epoch 1: rank 0 alone writes the checkpoint, whole (no temp file left), on node-0's disk.
    for workdir in workdirs:
        (workdir / "ckpt" / "checkpoint.pt").unlink(missing_ok=True)
    first = launch("--stop-after-epoch 1")
    saved = [line for line in first.stdout.splitlines() if "checkpoint saved" in line]
    assert saved and all(line.startswith("node-0 r0 ") for line in saved), "only rank 0 writes checkpoints"
    assert sorted(p.name for p in (workdirs[0] / "ckpt").iterdir()) == ["checkpoint.pt"]
    assert [(w / "ckpt" / "checkpoint.pt").exists() for w in workdirs] == [True, False]
    after_epoch_1 = (workdirs[0] / "ckpt" / "checkpoint.pt").read_bytes()

    # Relaunched with --resume, node-1 without the checkpoint: exactly the uninterrupted weights.
    resumed = launch(f"--resume --save-weights {tmp_path / 'resumed.pt'}")
    for rank in (2, 3):
        assert re.search(rf"^node-1 r{rank} +\| rank {rank}: local checkpoint missing or different, using rank 0's$",
                         resumed.stdout, re.M), resumed.stdout
    assert "Numpy is not available" not in resumed.stdout + resumed.stderr
    assert_state_dicts_equal(load(tmp_path / "resumed.pt"), load(tmp_path / "whole.pt"))
    assert assert_replicas_in_sync(resumed.stdout, world_size=4) == checksum

    # The same checkpoint on every node: each rank resumes from its own copy, to the same weights.
    for workdir in workdirs:
        (workdir / "ckpt").mkdir(exist_ok=True)
        (workdir / "ckpt" / "checkpoint.pt").write_bytes(after_epoch_1)
    again = launch(f"--resume --save-weights {tmp_path / 'again.pt'}")
    assert again.stdout.count("resumed from") >= 1 and "using rank 0's" not in again.stdout, again.stdout
    assert_state_dicts_equal(load(tmp_path / "again.pt"), load(tmp_path / "whole.pt"))
    assert assert_replicas_in_sync(again.stdout, world_size=4) == checksum


def test_arguments_and_env_arrive_byte_for_byte(make_sandbox, tmp_path: Path) -> None:
    box = make_sandbox(2, master_port=free_port(), script="tests/scripts/echo_args.py", script_args=HOSTILE_ARGS)
    out_dir = tmp_path / "echo"
    out_dir.mkdir()
    hostile_env = "a b $(touch /tmp/launcher-pwned) `id` ; \"' \n ✓"
    data = yaml.safe_load(box.inventory.read_text())
    data["defaults"]["env"] = {"ECHO_OUT_DIR": str(out_dir), "ECHO_HOSTILE": hostile_env}
    box.inventory.write_text(yaml.safe_dump(data, allow_unicode=True))
    result = inv("launch", "--hosts", str(box.inventory), log_dir=tmp_path / "logs")
    assert result.returncode == 0, result.stdout + result.stderr
    records = [json.loads((out_dir / f"rank{r}.json").read_text()) for r in (0, 1)]
    for record in records:
        assert record["argv"] == HOSTILE_ARGS
        assert record["env"]["ECHO_HOSTILE"] == hostile_env
        assert record["cwd"] == str(REPO)
    assert [r["host"] for r in records] == ["node-0", "node-1"]
    assert not Path("/tmp/launcher-pwned").exists()


def test_failing_node_is_named_with_its_exit_code(make_sandbox, tmp_path: Path) -> None:
    box = make_sandbox(2, torchrun="stand-in",
                       master_port=free_port(), script="tests/scripts/exit_on_node.py", script_args=["1", "3"])
    result = inv("launch", "--hosts", str(box.inventory), "-v", log_dir=tmp_path / "logs", timeout=120)
    assert result.returncode == 3, result.stdout + result.stderr
    assert "root cause: node-1, rank 1 (local rank 0), exit code 3" in result.stderr
    assert "node-0: exit code" in result.stderr and "stopped by the launcher" in result.stderr
    run_id = run_id_of(result.stderr)
    # node-0 was stopped by the launcher: torchrun's lines on it (its signal, its SignalException traceback) are one
    # line on the console, as after a Ctrl-C; node-1's own failure keeps every line.
    node0 = [line for line in result.stdout.splitlines() if line.startswith("node-0 ")]
    assert "SignalException" not in result.stdout and "death signal" not in result.stdout, result.stdout
    assert re.fullmatch(rf"node-0     \| stopped by the launcher \(node-1 failed\); torchrun's \d+ line\(s\) on it "
                        rf"\(its signal, its traceback\) are in {tmp_path}/logs/{run_id}/node-0.log", node0[-1]), node0
    assert "SignalException" in (tmp_path / "logs" / run_id / "node-0.log").read_text()
    assert run_processes(run_id) == []
    # the launcher's trace, read for its decisions: written for every run, on the console too with -v
    trace = (tmp_path / "logs" / run_id / "launcher.log").read_text()
    for said in (f"run {run_id}: 2 node(s) (node-0, node-1)", "node-0: connected to", "the start gate's checks passed",
                 f"run {run_id}: starting -> running (2 node(s) started)", "node-1: started",
                 "node-1 ended (exited, exit code 1, stop reason None): StopRun(node='node-1')",
                 f"run {run_id}: running -> stopping (node-1 failed", "stop (grace", "node-0 ended (exited, exit code",
                 "the run ended: failed (root cause: node-1, rank 1 (local rank 0), exit code 3); exit code 3",
                 f"run {run_id}: stopping -> ended"):
        assert said in trace, (said, trace)
    assert "the run ended: failed" in result.stderr and "launcher.run.handle" in result.stderr  # -v


def test_dead_node_fails_before_anything_starts(make_sandbox, tmp_path: Path) -> None:
    box = make_sandbox(3, torchrun="stand-in", master_port=free_port(), script="tests/scripts/sleeper.py")
    sandbox.stop_node(box.state_dir, 2)
    result = inv("launch", "--hosts", str(box.inventory), log_dir=tmp_path / "logs", timeout=60)
    assert result.returncode == 1
    assert "node-2: refused: connection refused" in result.stderr, result.stderr
    assert "nothing was started" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert runs_on(box) == [], "a run directory was created although a node was down"


def test_dry_run_prints_every_node_command_and_starts_nothing(make_sandbox, tmp_path: Path) -> None:
    box = make_sandbox(2, nproc_per_node=2, master_port=29999)
    edit_inventory(box.inventory, job={"script": "train/ddp.py", "args": ["--epochs", 3, "it's"]})
    sandbox.down(box.state_dir)  # a dry run must not even connect
    result = inv("launch", "--hosts", str(box.inventory), "--dry-run", log_dir=tmp_path / "logs")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "-m torch.distributed.run --nnodes 2 --node-rank 0 --nproc-per-node 2 --master-addr node-0 " \
           "--master-port 29999" in out
    assert "--node-rank 1" in out and "train/ddp.py --epochs 3 'it'\"'\"'s'" in out
    assert "why each flag is there" in out
    assert not (tmp_path / "logs").exists()


def test_launch_refuses_in_seconds_when_a_node_cannot_resolve_the_master(make_sandbox, tmp_path: Path) -> None:
    box = make_sandbox(2, torchrun="stand-in",
                       master_port=free_port(), script="tests/scripts/sleeper.py", unresolvable={1: [0]})
    t0 = time.monotonic()
    result = inv("launch", "--hosts", str(box.inventory), log_dir=tmp_path / "logs", timeout=120)
    assert time.monotonic() - t0 < 30  # torchrun itself would retry "gai error -2" for many minutes
    assert result.returncode == 1, result.stdout + result.stderr
    assert "nothing was started" in result.stderr
    assert f'add "{box.nodes[0].addr} node-0" to /etc/hosts on node-1' in result.stderr, result.stderr
    assert runs_on(box) == []

    report = inv("doctor", "--hosts", str(box.inventory), "--json")
    assert report.returncode == 1
    findings = json.loads(report.stdout)["findings"]
    assert any(f["host"] == "node-1" and f["check"] == "dns" and f["status"] == "fail" for f in findings)
    table = inv("doctor", "--hosts", str(box.inventory))
    assert table.returncode == 1 and "node-1" in table.stdout and "fix:" in table.stdout


def test_the_logs_folder_a_run_names_exists_when_its_workers_wrote_nothing(make_sandbox, tmp_path: Path) -> None:
    quiet = tmp_path / "quiet.py"
    quiet.write_text("import sys\nsys.exit(int(sys.argv[1]))\n")
    for code in (0, 3):
        box = make_sandbox(2, torchrun="stand-in", master_port=free_port(), script=str(quiet), script_args=[str(code)])
        result = inv("launch", "--hosts", str(box.inventory), "--skip-doctor", log_dir=tmp_path / "logs", timeout=120)
        assert result.returncode == code, result.stdout + result.stderr
        folder = tmp_path / "logs" / run_id_of(result.stderr)
        assert f"logs: {folder}/" in result.stderr
        # each node's log, empty, the launch's journal (the run's page's account) and its trace
        assert sorted(p.name for p in folder.iterdir()) == ["journal.json", "launcher.log", "node-0.log", "node-1.log"]
