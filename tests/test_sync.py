"""Code sync: the local file list (git, .gitignore, excludes), the quick check, the node program's refusals, and
`inv sync` / `inv launch --sync` on real sshd nodes, each with a workdir of its own."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from _train_helpers import assert_replicas_in_sync
from conftest import free_port
from helpers import REPO

from launcher import inventory, sandbox
from launcher.remote import BOOTSTRAP, program_input
from launcher.sync import SYNCD_SOURCE, Entry, changed, is_current, local_tree, same_time

SENT = re.compile(r"^(node-\d+): sent (\d+) file\(s\), (.+?) in [\d.]+s; (\d+) unchanged -> (.+)$", re.M)


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def git(root: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True,
                   env={**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                        "GIT_COMMITTER_EMAIL": "t@t"})


def project(root: Path, with_git: bool) -> Path:
    """A small project: tracked code, an untracked file, git-ignored outputs, a nested .gitignore, a data folder."""
    write(root / "train.py", "print('train')\n")
    write(root / "pkg" / "model.py", "W = 1\n")
    write(root / ".gitignore", "*.log\nout/\n")
    write(root / "run.log", "ignored\n")
    write(root / "out" / "ckpt.pt", "ignored\n")
    write(root / "pkg" / ".gitignore", "cache.bin\n!keep.log\n")
    write(root / "pkg" / "cache.bin", "ignored by the nested .gitignore\n")
    write(root / "pkg" / "keep.log", "re-included by the nested .gitignore\n")
    write(root / "data" / "big.bin", "excluded by the inventory\n")
    write(root / "notes.txt", "untracked, not ignored\n")
    if with_git:
        git(root, "init", "-q")
        git(root, "add", "train.py", "pkg/model.py", ".gitignore", "pkg/.gitignore")
        git(root, "commit", "-q", "-m", "init")
    return root


EXPECTED = {".gitignore", "notes.txt", "pkg/.gitignore", "pkg/keep.log", "pkg/model.py", "train.py"}


# --- the local tree ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("with_git", [True, False], ids=["git ls-files", "walk + .gitignore"])
def test_tree_honours_gitignore_and_excludes(tmp_path: Path, with_git: bool) -> None:
    root = project(tmp_path / "p", with_git)
    tree = local_tree(root, exclude=("data/",))
    assert tree.paths == EXPECTED
    assert tree.how == ("git ls-files" if with_git else "walk + .gitignore")
    # Exclude patterns are gitignore patterns: a bare name takes a folder and all under it; `!` re-includes.
    assert local_tree(root, exclude=("data", "pkg", "*.txt")).paths == {".gitignore", "train.py"}
    assert local_tree(root, exclude=("*.py", "!train.py")).paths == EXPECTED - {"pkg/model.py"} | {"data/big.bin"}


def test_symlinks_stay_links_and_ones_leaving_the_tree_are_skipped(tmp_path: Path) -> None:
    root = project(tmp_path / "p", with_git=False)
    (root / "pkg" / "alias.py").symlink_to("model.py")
    (root / "up").symlink_to("../secret")
    (root / "abs").symlink_to("/etc/passwd")
    tree = local_tree(root, exclude=("data/",))
    links = {e.path: e.target for e in tree.entries if e.kind == "link"}
    assert links == {"pkg/alias.py": "model.py"}
    assert "skipped symlink up -> ../secret: it points outside the tree" in tree.notes
    assert "skipped symlink abs -> /etc/passwd: it points outside the tree" in tree.notes


def test_quick_check_compares_size_mode_mtime_or_link_target() -> None:
    f = Entry("a.py", "file", size=10, mtime_ns=1_700_000_000_123_456_789, mode=0o644)
    assert is_current(f, ["file", 10, f.mtime_ns, 0o644, None])
    assert not is_current(f, None)
    assert not is_current(f, ["file", 11, f.mtime_ns, 0o644, None])
    assert not is_current(f, ["file", 10, f.mtime_ns + 1, 0o644, None])
    assert not is_current(f, ["file", 10, f.mtime_ns, 0o755, None])
    assert not is_current(f, ["link", 0, 0, 0, "a.py"])
    # A node file system that keeps whole seconds (or µs) has the time cut, not another time.
    assert same_time(f.mtime_ns, 1_700_000_000_000_000_000) and same_time(f.mtime_ns, 1_700_000_000_123_456_000)
    assert not same_time(f.mtime_ns, 1_700_000_001_000_000_000)
    link = Entry("l", "link", target="a.py")
    assert is_current(link, ["link", 0, 5, 0, "a.py"]) and not is_current(link, ["link", 0, 5, 0, "b.py"])
    assert changed([f, link], {"l": ["link", 0, 5, 0, "a.py"]}) == [f]


# --- the node program, run here as a node runs it -------------------------------------------------------------


def syncd(dest: Path, paths: list[str], stream: bytes | None) -> tuple[list[dict], int]:
    """Run launcher/syncd.py through the bootstrap; `stream` (None: none) goes after its first answer."""
    proc = subprocess.Popen([sys.executable, "-c", BOOTSTRAP], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdin and proc.stdout
    proc.stdin.write(program_input(SYNCD_SOURCE, {"dest": str(dest), "paths": paths, "token": "t0"}))
    proc.stdin.flush()
    answers = [json.loads(proc.stdout.readline())]
    if "error" not in answers[0]:
        try:
            proc.stdin.write(stream or b"")
            proc.stdin.close()
        except BrokenPipeError:
            pass
        answers += [json.loads(line) for line in proc.stdout.read().splitlines()]
    return answers, proc.wait(timeout=30)


def frame(path: str, data: bytes = b"", kind: str = "file", target: str | None = None) -> bytes:
    header = {"path": path, "kind": kind, "size": len(data), "mtime_ns": 1_600_000_000_000_000_000, "mode": 0o644}
    if target is not None:
        header["target"] = target
    return (json.dumps(header) + "\n").encode() + data


END = b'{"end": true}\n'


@pytest.mark.parametrize("name", ["../evil", "/etc/evil", "a/../../evil", "./a", "a//b", ""])
def test_node_program_refuses_names_that_leave_the_destination(tmp_path: Path, name: str) -> None:
    dest = tmp_path / "dest"
    answers, code = syncd(dest, [name], None)  # refused at the manifest already
    assert code == 1 and "refusing path" in answers[0]["error"]
    answers, code = syncd(dest, ["ok.txt"], frame("ok.txt", b"fine") + frame(name, b"evil") + END)
    assert code == 1 and "refusing path" in answers[-1]["error"], answers
    assert not dest.exists() and not (tmp_path / "evil").exists()  # nothing written, not even ok.txt


def test_node_program_writes_nothing_unless_the_whole_stream_arrives(tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    (dest / "pkg").mkdir(parents=True)
    (dest / "pkg" / "model.py").write_text("old\n")
    cut = frame("new.py", b"whole") + frame("pkg/model.py", b"new content")[:-3]  # the controller died mid-file
    answers, code = syncd(dest, ["new.py", "pkg/model.py"], cut)
    assert code == 1 and "stream ended in the middle of pkg/model.py" in answers[-1]["error"]
    assert sorted(p.name for p in dest.rglob("*")) == ["model.py", "pkg"]  # no temp file, no new.py
    assert (dest / "pkg" / "model.py").read_text() == "old\n"

    outside = tmp_path / "outside"
    outside.mkdir()
    (dest / "data").symlink_to(outside)
    answers, code = syncd(dest, ["data/x"], frame("data/x", b"escape") + END)
    assert code == 1 and "is a symlink on the node; refusing to write through it" in answers[-1]["error"]
    answers, code = syncd(dest, ["l"], frame("l", kind="link", target="../../etc/passwd") + END)
    assert code == 1 and "points outside the destination" in answers[-1]["error"]
    assert list(outside.iterdir()) == [] and not (dest / "l").exists()

    answers, code = syncd(dest, ["new.py", "pkg/model.py"], frame("new.py", b"whole") + frame("pkg/model.py", b"n")
                          + END)
    assert code == 0 and answers[-1] == {"ok": True, "entries": 2, "bytes": 6}
    assert (dest / "new.py").read_text() == "whole" and (dest / "pkg" / "model.py").read_text() == "n"
    assert (dest / "new.py").stat().st_mtime_ns == 1_600_000_000_000_000_000


# --- on real sshd nodes ---------------------------------------------------------------------------------------


def own_workdirs(box: sandbox.Sandbox, root: Path, **top: object) -> list[Path]:
    """Give each sandbox node a workdir of its own (they share one file system); returns them."""
    data = yaml.safe_load(box.inventory.read_text())
    workdirs = [root / f"node-{i}" / "work" for i in range(len(box.nodes))]
    data["hosts"] = [{"name": f"node-{i}", "workdir": str(w)} for i, w in enumerate(workdirs)]
    data.update(top)
    box.inventory.write_text(yaml.safe_dump(data, sort_keys=False))
    return workdirs


def inv_in(cwd: Path, *args: str, log_dir: Path | None = None, timeout: float = 180
           ) -> subprocess.CompletedProcess[str]:
    """`inv ARGS` with this repo's tasks, run from `cwd` (the tree `inv sync` sends by default)."""
    env = {**os.environ, **({"INVOKE_LAUNCHER_LOG_DIR": str(log_dir)} if log_dir else {})}
    return subprocess.run([sys.executable, "-m", "invoke", "-r", str(REPO), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout, check=False)


def sent(output: str) -> dict[str, tuple[int, str, int]]:
    """node -> (files sent, bytes as printed, unchanged), from `inv sync`'s lines."""
    return {m[1]: (int(m[2]), m[3], int(m[4])) for m in SENT.finditer(output)}


def relative_files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if not p.is_dir()}


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
        assert (w / "launcher" / "syncd.py").exists() and not (w / ".git").exists()


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
        assert not [p for p in w.rglob("*.sync")]

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
@pytest.mark.skipif(not hasattr(inventory, "SyncSpec"), reason="the inventory has no `sync:` entry yet")
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
