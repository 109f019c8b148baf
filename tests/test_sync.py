"""Code sync: the local file list (git, .gitignore, excludes), the quick check, the node program's refusals, and
`inv sync` / `inv launch --sync` on real sshd nodes, each with a workdir of its own."""

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
from _train_helpers import assert_replicas_in_sync
from conftest import free_port
from helpers import REPO

from launcher import sandbox
from launcher.config import inventory
from launcher.sandbox import procs
from launcher.sync.push import SYNCD_SOURCE
from launcher.sync.tree import Entry, changed, is_current, local_tree, same_time
from launcher.transport.program import BOOTSTRAP, program_input
from tests.support.nodeenv import node_python
from tests.support.procs import children

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


def conf_made_a_link(root: Path, elsewhere: Path, secret: str) -> Path:
    """A tracked `conf/credentials`, then `conf` replaced by a link to `elsewhere` (git still lists the file)."""
    write(root / "conf" / "credentials", "tracked\n")
    git(root, "add", "conf/credentials")
    git(root, "commit", "-q", "-m", "conf")
    write(elsewhere / "credentials", secret)
    (root / "conf" / "credentials").unlink()
    (root / "conf").rmdir()
    (root / "conf").symlink_to(elsewhere)
    return elsewhere


def test_a_folder_replaced_by_a_symlink_sends_nothing_from_behind_it(tmp_path: Path) -> None:
    root = project(tmp_path / "p", with_git=True)
    elsewhere = conf_made_a_link(root, tmp_path / "elsewhere", "a key from outside the tree\n")
    tree = local_tree(root)
    assert "conf/credentials" not in tree.paths
    assert f"skipped 1 file(s) under conf/: conf is a symlink (-> {elsewhere}), and what lies behind it is not part " \
           "of the tree" in tree.notes


def test_a_chain_of_links_that_leaves_the_tree_is_skipped_and_refused(tmp_path: Path) -> None:
    root = project(tmp_path / "p", with_git=False)
    (root / "d").mkdir()
    (root / "d" / "up").symlink_to("..")  # lexically inside
    (root / "d" / "e").symlink_to("up/../../outside")  # lexically inside too, but up is the tree's root
    tree = local_tree(root, exclude=("data/",))
    assert "d/e" not in tree.paths and "d/up" in tree.paths
    assert "skipped symlink d/e -> up/../../outside: it passes through the symlink d/up, and a chain of links can " \
           "lead outside the tree" in tree.notes
    # The node refuses it as well (a controller of another version, or a link already on the node).
    dest = tmp_path / "dest"
    answers, code = syncd(dest, ["d/up", "d/e"], frame("d/up", kind="link", target="..")
                          + frame("d/e", kind="link", target="up/../../outside") + END)
    assert code == 1 and answers[-1]["error"] == (
        "refusing symlink d/e -> up/../../outside: it passes through the symlink d/up, and a chain of links can lead "
        "outside the destination")
    assert relative_files(dest) == set()


def test_env_files_never_travel(tmp_path: Path) -> None:
    root = project(tmp_path / "p", with_git=False)
    write(root / "hosts" / ".env", "HF_TOKEN=hf_secret\n")
    write(root / "pkg" / ".env", "WANDB_API_KEY=secret\n")
    write(root / "hosts" / "tokens.env", "A=1\n")
    tree = local_tree(root, exclude=("data/",), leave_out=[root / "hosts" / "tokens.env"])
    assert tree.paths == EXPECTED
    for name in ("hosts/.env", "pkg/.env", "hosts/tokens.env"):
        assert f"left out {name}: an env file (its values reach the nodes with the launch, never as a file)" \
            in tree.notes


@pytest.mark.parametrize("with_git", [True, False], ids=["git ls-files", "walk + .gitignore"])
def test_an_unreadable_folder_is_one_sentence(tmp_path: Path, with_git: bool) -> None:
    root = project(tmp_path / "p", with_git=with_git)
    (root / "private").mkdir(mode=0o000)
    # Root reads anything; without CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH it sees what a user sees.
    code = f"from launcher.sync.tree import local_tree\nlocal_tree({str(root)!r}, exclude=('data/',))"
    result = subprocess.run(["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--", sys.executable, "-c",
                             "import sys\nfrom launcher.errors import LauncherError\ntry:\n    exec(sys.argv[1])\n"
                             "except LauncherError as e:\n    print(e)\n    sys.exit(1)\n", code],
                            capture_output=True, text=True, timeout=60, check=False, cwd=REPO)
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stdout == f"cannot read {root / 'private'} to list the sync tree (Permission denied); fix its " \
        "permissions or leave it out with sync.exclude\n"
    (root / "private").chmod(0o755)


# --- the node program, run here as a node runs it -------------------------------------------------------------


def syncd(dest: Path | str, paths: list[str], stream: bytes | None, env: dict[str, str] | None = None,
          **request: object) -> tuple[list[dict], int]:
    """Run launcher/node/syncd.py through the bootstrap (`env`: changes to the node's environment); `stream` (None:
    none) goes after its first answer."""
    proc = subprocess.Popen([node_python(), "-c", BOOTSTRAP], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            env={**os.environ, **(env or {})})
    assert proc.stdin and proc.stdout
    request = {"dest": str(dest), "paths": paths, "token": "t0", "lock_wait": 5.0, **request}
    proc.stdin.write(program_input(SYNCD_SOURCE, request))
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


def test_a_failed_rename_puts_back_what_was_renamed(tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    for name in ("a.py", "b.py", "c.py"):
        write(dest / name, f"old {name}\n")
    pinned = write(tmp_path / "pinned", "bind-mounted\n")
    subprocess.run(["mount", "--bind", str(pinned), str(dest / "b.py")], check=True)  # renaming onto it: EBUSY
    try:
        stream = frame("a.py", b"new a") + frame("b.py", b"new b") + frame("c.py", b"new c") + END
        answers, code = syncd(dest, ["a.py", "b.py", "c.py"], stream)
    finally:
        subprocess.run(["umount", str(dest / "b.py")], check=True)
    assert code == 1
    assert answers[-1]["error"] == ("renaming b.py into place failed (Device or resource busy); the 1 file(s) "
                                    "renamed before it were put back: the node keeps its old tree")
    assert {n: (dest / n).read_text() for n in ("a.py", "b.py", "c.py")} == {
        "a.py": "old a.py\n", "b.py": "old b.py\n", "c.py": "old c.py\n"}
    assert relative_files(dest) == {"a.py", "b.py", "c.py"}  # no temporary or kept file left


def test_long_and_wide_names_sync(tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    wide = "訓" * 84  # 252 bytes: a valid name; a temporary name built from it would not be
    long_a, long_b = "x" * 200 + "a" * 40, "x" * 200 + "b" * 40  # the same first 200 characters
    names = [wide, long_a, long_b]
    stream = b"".join(frame(n, n.encode()[-3:]) for n in names) + END
    answers, code = syncd(dest, names, stream)
    assert code == 0, answers
    assert {n: (dest / n).read_bytes() for n in names} == {n: n.encode()[-3:] for n in names}


def test_a_home_directory_itself_is_refused_unless_named(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    env = {"HOME": str(home)}
    answers, code = syncd("~", ["train.py"], frame("train.py", b"x") + END, env=env)
    assert code == 1 and answers[-1]["error"] == (
        f"refusing to sync into the home directory {home} itself: the tree's dotfiles (.gitignore, .env, .config/) "
        "would land over the user's own; set a workdir for this host, or sync.dest in the inventory "
        "(`dest: '~'` if you mean it)")
    assert list(home.iterdir()) == []
    answers, code = syncd("~", ["train.py"], frame("train.py", b"x") + END, env=env, home_ok=True)
    assert code == 0, answers
    assert (home / "train.py").read_bytes() == b"x"


def test_two_syncs_into_one_destination_take_turns(tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    first = start_syncd(dest, ["a.py"], lock_wait=5.0)
    assert "manifest" in json.loads(first.stdout.readline())  # it holds the lock from here to its end
    answers, code = syncd(dest, ["b.py"], frame("b.py", b"b") + END, lock_wait=0.5)
    assert code == 1 and answers == [{"error": f"another sync into {dest} is under way (waited 0.5 s for it); run "
                                               "this one again when it has ended"}]
    second = start_syncd(dest, ["a.py"], lock_wait=10.0)  # waits for the first, then sees what it wrote
    first.stdin.write(frame("a.py", b"from the first") + END)
    first.stdin.close()
    assert json.loads(first.stdout.readline()) == {"ok": True, "entries": 1, "bytes": 14}
    manifest = json.loads(second.stdout.readline())["manifest"]
    assert manifest["a.py"][:2] == ["file", 14]
    second.stdin.write(END)
    second.stdin.close()
    assert json.loads(second.stdout.readline())["ok"] and second.wait(10) == 0 and first.wait(10) == 0
    assert relative_files(dest) == {"a.py"}  # the lock file went with the last sync


def start_syncd(dest: Path, paths: list[str], **request: object) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([node_python(), "-c", BOOTSTRAP], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdin and proc.stdout
    proc.stdin.write(program_input(SYNCD_SOURCE, {"dest": str(dest), "paths": paths, "token": "t1", **request}))
    proc.stdin.flush()
    return proc


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
        assert (w / "launcher" / "node" / "syncd.py").exists() and not (w / ".git").exists()


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
    assert re.search(r"^node-0: sync: the node took no data for 2 s \(a hung disk\?\); what was sent is removed there "
                     r"when the sync program ends, so nothing was changed \(fix: check node-0's disk under \S+\)$",
                     out, re.M), out
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
        found += [k for k in kids if (procs.name(k) or "").startswith("python")]
    return found
