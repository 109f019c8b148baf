"""Code sync: the node program's refusals, and `inv sync` / `inv launch --sync` on real sshd nodes, each with a
workdir of its own (the local file list and the quick check: tests/unit/test_sync.py; the relay between nodes:
test_sync_relay.py)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from devtools import sandbox
from devtools.observe import children, free_port, process_name
from tests._train_helpers import assert_replicas_in_sync
from tests.helpers import REPO, run_id_of
from tests.support.project import EXPECTED, conf_made_a_link, project, write
from tests.support.syncrun import END, frame, inv_in, own_workdirs, relative_files, start_syncd, syncd

SENT = re.compile(r"^(node-\d+): sent (\d+) file\(s\), (.+?) in [\d.]+s; (\d+) unchanged -> (.+)$", re.M)


# --- the node program, run here as a node runs it -------------------------------------------------------------


def test_two_syncs_into_one_destination_take_turns(tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    first = start_syncd(dest, ["a.py"], lock_wait=5.0)
    assert "manifest" in json.loads(first.stdout.readline())  # it holds the lock from here to its end
    answers, code = syncd(dest, ["b.py"], frame("b.py", b"b") + END, lock_wait=0.5)
    assert code == 1 and answers == [{"waiting": f"another sync into {dest} holds its lock"},
                                     {"error": f"another sync into {dest} is under way (waited 0.5 s for it); run "
                                               "this one again when it has ended"}]
    second = start_syncd(dest, ["a.py"], lock_wait=10.0)  # waits for the first, then sees what it wrote
    assert json.loads(second.stdout.readline()) == {"waiting": f"another sync into {dest} holds its lock"}
    first.stdin.write(frame("a.py", b"from the first") + END)
    first.stdin.close()
    assert json.loads(first.stdout.readline()) == {"ok": True, "entries": 1, "bytes": 14}
    manifest = json.loads(second.stdout.readline())["manifest"]
    assert manifest["a.py"][:2] == ["file", 14]
    second.stdin.write(END)
    second.stdin.close()
    assert json.loads(second.stdout.readline())["ok"] and second.wait(10) == 0 and first.wait(10) == 0
    assert relative_files(dest) == {"a.py"}  # the lock file went with the last sync


# --- on real sshd nodes ---------------------------------------------------------------------------------------


def sent(output: str) -> dict[str, tuple[int, str, int]]:
    """node -> (files sent, bytes as printed, unchanged), from `inv sync`'s lines."""
    return {m[1]: (int(m[2]), m[3], int(m[4])) for m in SENT.finditer(output)}


@pytest.mark.integration
def test_launch_with_sync_trains_on_empty_workdirs(make_sandbox, tmp_path: Path) -> None:
    box = make_sandbox(2, master_port=free_port())
    workdirs = own_workdirs(box, tmp_path)
    result = inv_in(REPO, "launch", "--hosts", str(box.inventory), "--sync", "--args",
                    "--epochs 1 --dataset-size 64 --batch-size 8", log_dir=tmp_path / "logs", timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    assert_replicas_in_sync(result.stdout, world_size=2)
    lines = sent(result.stderr)
    assert set(lines) == {"node-0", "node-1"} and all(n > 0 and unchanged == 0 for n, _, unchanged in lines.values())
    assert "script" in result.stderr and "all passed" in result.stderr  # the doctor ran after the sync
    for w in workdirs:
        assert (w / "train" / "ddp.py").read_bytes() == (REPO / "train" / "ddp.py").read_bytes()
        assert (w / "launcher" / "node" / "sync" / "syncd.py").exists() and not (w / ".git").exists()
    # The run's page: each node's own SSH-connected and sync-done moments, in the start's order (#49).
    run_id = run_id_of(result.stdout + result.stderr)
    said = inv_in(REPO, "report", "--hosts", str(box.inventory), "--run", run_id, "--json", log_dir=tmp_path / "logs")
    assert said.returncode == 0, said.stderr
    for row in (r for r in json.loads(said.stdout)["start"] if r["rank"] is None):
        phases = row["phases"]
        assert phases["connected"] < phases["synced"] < phases["ready"] <= phases["torchrun"], (row["node"], phases)


@pytest.mark.integration
def test_second_sync_sends_only_the_changed_file(make_sandbox, tmp_path: Path) -> None:
    box = make_sandbox(2, master_port=free_port())
    workdirs = own_workdirs(box, tmp_path / "nodes")
    src = project(tmp_path / "src", with_git=True)
    everything = EXPECTED | {"data/big.bin"}  # no exclude list in this inventory

    first = inv_in(src, "sync", "--hosts", str(box.inventory))
    assert first.returncode == 0, first.stdout + first.stderr
    assert {n: v[0] for n, v in sent(first.stdout).items()} == {"node-0": 7, "node-1": 7}, first.stdout
    for w in workdirs:
        assert relative_files(w) == everything  # git-ignored files stayed home
        assert (w / "train.py").stat().st_mtime_ns == (src / "train.py").stat().st_mtime_ns

    write(src / "pkg" / "model.py", "W = 2  # changed\n")
    second = inv_in(src, "sync", "--hosts", str(box.inventory))
    assert second.returncode == 0, second.stdout + second.stderr
    assert sent(second.stdout) == {"node-0": (1, "17 B", 6), "node-1": (1, "17 B", 6)}, second.stdout
    assert "synced 2/2 node(s)" in second.stdout
    for w in workdirs:
        assert (w / "pkg" / "model.py").read_text() == "W = 2  # changed\n"
        assert not [p for p in w.rglob(".ddp-sync.*")] and not (w / ".ddp-launcher-sync.lock").exists()

    third = inv_in(src, "sync", "--hosts", str(box.inventory))
    assert {n: v[0] for n, v in sent(third.stdout).items()} == {"node-0": 0, "node-1": 0}, third.stdout


@pytest.mark.integration
def test_each_node_that_cannot_be_synced_says_why_in_one_line(make_sandbox, tmp_path: Path) -> None:
    box = make_sandbox(3, master_port=free_port())
    workdirs = own_workdirs(box, tmp_path / "nodes")
    src = project(tmp_path / "src", with_git=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    workdirs[1].mkdir(parents=True)
    (workdirs[1] / "pkg").symlink_to(outside)  # writing pkg/model.py there would land outside the workdir
    sandbox.stop_node(box.state_dir, 2)

    result = inv_in(src, "sync", "--hosts", str(box.inventory))
    assert result.returncode == 1, result.stdout + result.stderr
    assert sent(result.stdout).keys() == {"node-0"}
    assert re.search(r"^node-1: sync: \S+/node-1/work/pkg is a symlink on the node; refusing to write through it",
                     result.stdout, re.M), result.stdout
    assert re.search(r"^node-2: refused: connection refused by ", result.stdout, re.M), result.stdout
    assert "synced 1/3 node(s)" in result.stdout
    assert list(outside.iterdir()) == [] and relative_files(workdirs[1]) == set()  # nothing half-written
    assert "Traceback" not in result.stdout + result.stderr


@pytest.mark.integration
def test_inventory_sync_entry_names_the_tree_and_its_excludes(make_sandbox, tmp_path: Path) -> None:
    box = make_sandbox(2, master_port=free_port())
    src = project(tmp_path / "src", with_git=True)
    workdirs = own_workdirs(box, tmp_path / "nodes", sync={"src": str(src), "exclude": ["data/", "notes.txt"]})
    result = inv_in(REPO, "sync", "--hosts", str(box.inventory))
    assert result.returncode == 0, result.stdout + result.stderr
    for w in workdirs:
        assert relative_files(w) == EXPECTED - {"notes.txt"}


@pytest.mark.integration
def test_launch_starts_nothing_when_a_node_cannot_be_synced(make_sandbox, tmp_path: Path) -> None:
    box = make_sandbox(2, master_port=free_port())
    workdirs = own_workdirs(box, tmp_path / "nodes")
    workdirs[1].mkdir(parents=True)
    (workdirs[1] / "train").symlink_to(tmp_path)  # train/ddp.py would be written through it
    result = inv_in(REPO, "launch", "--hosts", str(box.inventory), "--sync", log_dir=tmp_path / "logs")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "error: could not sync the code to 1 node(s); nothing was started:" in result.stderr
    assert re.search(r"^  node-1: sync: \S+/train is a symlink on the node", result.stderr, re.M), result.stderr
    assert "started" not in result.stderr.replace("nothing was started", "") and "Traceback" not in result.stderr
    assert not (tmp_path / "ddp.py").exists() and relative_files(workdirs[1]) == set()


@pytest.mark.integration
def test_env_files_and_files_behind_a_symlinked_folder_never_reach_a_node(make_sandbox, tmp_path: Path) -> None:
    box = make_sandbox(1, master_port=free_port())
    src = project(tmp_path / "src", with_git=True)
    elsewhere = conf_made_a_link(src, tmp_path / "elsewhere", "KEY-FROM-OUTSIDE\n")
    write(src / "hosts" / ".env", "HF_TOKEN=hf_never_on_a_node\n")  # the example inventory's env_file
    workdirs = own_workdirs(box, tmp_path / "nodes")
    data = yaml.safe_load(box.inventory.read_text())
    data["defaults"]["env_file"] = {"path": str(src / "hosts" / ".env"), "secret": True}
    box.inventory.write_text(yaml.safe_dump(data, sort_keys=False))

    result = inv_in(src, "sync", "--hosts", str(box.inventory))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "note: left out hosts/.env: an env file (its values reach the nodes with the launch, never as a file)" \
        in result.stdout
    assert f"note: skipped 1 file(s) under conf/: conf is a symlink (-> {elsewhere})" in result.stdout
    files = relative_files(workdirs[0])
    assert "hosts/.env" not in files and "conf/credentials" not in files and "train.py" in files
    assert not any("KEY-FROM-OUTSIDE" in (workdirs[0] / f).read_text(errors="replace") for f in files)


@pytest.mark.integration
def test_a_sync_into_the_nodes_home_itself_is_refused(make_sandbox, tmp_path: Path) -> None:
    box = make_sandbox(1, master_port=free_port())
    src = project(tmp_path / "src", with_git=True)
    data = yaml.safe_load(box.inventory.read_text())
    data["defaults"]["workdir"] = "~"  # what a hostfile gets with no launcher.defaults.workdir
    box.inventory.write_text(yaml.safe_dump(data, sort_keys=False))
    result = inv_in(src, "sync", "--hosts", str(box.inventory))
    assert result.returncode == 1, result.stdout + result.stderr
    assert re.search(r"^node-0: sync: refusing to sync into the home directory \S+ itself: the tree's dotfiles "
                     r"\(\.gitignore, \.env, \.config/\) would land over the user's own; set a workdir for this host, "
                     r"or sync.dest in the inventory \(`dest: '~'` if you mean it\)$", result.stdout, re.M), \
        result.stdout


@pytest.mark.integration
def test_a_node_that_stops_taking_data_fails_its_sync_within_the_silence_timeout(make_sandbox, tmp_path: Path
                                                                                 ) -> None:
    box = make_sandbox(2, master_port=free_port())
    workdirs = own_workdirs(box, tmp_path / "nodes")
    src = project(tmp_path / "src", with_git=False)
    (src / "big.bin").write_bytes(os.urandom(64 << 20))  # far more than the SSH window and the pipes hold
    proc = subprocess.Popen([sys.executable, "-m", "invoke", "-r", str(REPO), "sync", "--hosts", str(box.inventory),
                             "--silence-timeout", "2"], cwd=src, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    stopped: list[int] = []
    try:
        staged = workdirs[0]

        def receiving() -> bool:
            return staged.exists() and any(p.name.startswith(".ddp-sync.") for p in staged.iterdir())

        deadline = time.monotonic() + 60
        while not receiving():
            assert time.monotonic() < deadline and proc.poll() is None, "node-0 never started receiving"
            time.sleep(0.02)
        stopped = node_programs(box.nodes[0].pid)
        for pid in stopped:  # its disk hung, as far as the launcher can tell: it reads nothing more
            os.kill(pid, signal.SIGSTOP)
        t0 = time.monotonic()
        out, err = proc.communicate(timeout=60)
        took = time.monotonic() - t0
    finally:
        for pid in stopped:
            os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, out + err
    found = re.search(r"^node-0: sync: the node took no data for 2 s \(a hung disk\?\); what was sent is removed there "
                      r"when the sync program ends, so nothing was changed \(([\d.]+) (?:kB|MB|GB) had crossed the "
                      r"wire to it and was discarded there\) \(fix: check node-0's disk under \S+\)$", out, re.M)
    assert found and float(found.group(1)) > 0, out  # what crossed is said, never "0 B"
    lost = r"; [\d.]+ (?:kB|MB|GB) more crossed the wire to the nodes that failed, discarded there$"
    assert re.search(lost, out, re.M), out
    assert sent(out).keys() == {"node-1"} and (workdirs[1] / "big.bin").stat().st_size == 64 << 20
    assert took < 2 + 10, f"the sync ended {took:.1f} s after node-0 stopped reading"
    assert "Traceback" not in out + err


def node_programs(sshd: int) -> list[int]:
    """The programs a node's sshd runs for its sessions (not sshd itself): here, its sync program."""
    found, todo = [], [sshd]
    while todo:
        pid = todo.pop()
        kids = children(pid)
        todo += kids
        found += [k for k in kids if (process_name(k) or "").startswith("python")]
    return found
