"""Code sync: the local file list (git, .gitignore, excludes), the quick check, the node program's refusals, and
`inv sync` / `inv launch --sync` on real sshd nodes, each with a workdir of its own."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from launcher.config.inventory import parse_inventory
from launcher.errors import LauncherError
from launcher.sync.relay import asks_relay, relay_places, with_ports
from launcher.sync.stream import Contents, SyncStream
from launcher.sync.tree import Entry, changed, is_current, local_tree, project_tree, same_time
from tests.helpers import REPO
from tests.support.project import EXPECTED, conf_made_a_link, project, write
from tests.support.syncrun import END, frame, syncd

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


def test_a_folder_replaced_by_a_symlink_sends_nothing_from_behind_it(tmp_path: Path) -> None:
    root = project(tmp_path / "p", with_git=True)
    elsewhere = conf_made_a_link(root, tmp_path / "elsewhere", "a key from outside the tree\n")
    tree = local_tree(root)
    assert "conf/credentials" not in tree.paths
    assert f"skipped 1 file(s) under conf/: conf is a symlink (-> {elsewhere}), and what lies behind it is not part " \
           "of the tree" in tree.notes


class _Wire:
    """What a node's channel took: the headers and contents `SyncStream` sends, as they would cross the wire."""

    def __init__(self) -> None:
        self.data = bytearray()

    def send(self, data: bytes, timeout: float | None = None) -> bool:
        self.data += data
        return True


def _sent(contents: Contents, entry: Entry) -> bytes:
    """The bytes one node's session sends for `entry`."""
    wire = _Wire()
    session = SyncStream(wire, stall_timeout=5)  # type: ignore[arg-type]
    session.send_entry(contents, entry)
    session.flush()
    return bytes(wire.data)


@pytest.mark.parametrize("size", [100, 3 << 20], ids=["small, read once for all", "large, streamed"])
def test_a_folder_made_a_symlink_after_the_listing_sends_nothing_from_behind_it(tmp_path: Path, size: int) -> None:
    root = tmp_path / "p"
    write(root / "conf" / "settings.py", "x" * size)
    tree = local_tree(root)
    (entry,) = tree.entries
    write(tmp_path / "elsewhere" / "settings.py", "a key from outside the tree\n")
    (root / "conf" / "settings.py").unlink()
    (root / "conf").rmdir()
    (root / "conf").symlink_to(tmp_path / "elsewhere")  # between the listing and the send
    with pytest.raises(LauncherError, match=r"conf/settings\.py now lies behind a symlink"):
        _sent(Contents(root), entry)


def test_a_file_saved_anew_after_the_listing_is_sent_as_it_is_now(tmp_path: Path) -> None:
    root = tmp_path / "p"
    write(root / "train.py", "old\n")
    (entry,) = local_tree(root).entries
    write(root / "saved.tmp", "new, longer\n").replace(root / "train.py")  # an editor's save: another inode
    assert _sent(Contents(root), entry).endswith(b"new, longer\n")


def test_every_node_gets_the_same_bytes_of_a_file_edited_during_the_sync(tmp_path: Path) -> None:
    root = tmp_path / "p"
    write(root / "train.py", "first\n")
    (entry,) = local_tree(root).entries
    contents = Contents(root)
    first_node = _sent(contents, entry)
    write(root / "train.py", "edited meanwhile\n")
    assert _sent(contents, entry) == first_node  # read once, sent to every node
    assert b"edited meanwhile" in _sent(Contents(root, budget=0), entry)  # kept bytes are bounded: read again


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
def test_the_launchers_own_logs_never_travel(tmp_path: Path, with_git: bool) -> None:
    """launch --sync sent the launcher's logs/ to every node (untracked, not ignored): 43 files at the first sync,
    more with every run. Its log_dir is left out wherever it is in the tree, with no .gitignore line."""
    root = project(tmp_path / "p", with_git)
    for run in ("20261122-031701-259dd3", "20261122-041701-aaaaaa"):  # the .log files are ignored here anyway
        write(root / "logs" / run / "attempts.json", "[]\n")
        write(root / "logs" / run / "stacks-1" / "node-0-r0.txt", "Thread 0x1 (most recent call first):\n")
    write(root / "runs" / "x" / "answer.txt", "a log_dir of its own\n")
    cluster = parse_inventory(f"hosts: [a]\ndefaults: {{python: p, workdir: w}}\nsync: {{src: {root}, exclude: "
                              "[data/]}\n", "c.yaml")
    spec, tree = project_tree(cluster, outputs=[root / "logs"])
    assert spec.exclude == ("data/",)
    assert tree.paths == EXPECTED | {"runs/x/answer.txt"}
    assert "left out logs/: the launcher's own output (its log_dir), never synced" in tree.notes
    assert len(project_tree(cluster, outputs=[root / "runs"])[1].paths - EXPECTED) == 4  # logs/ is a user's here
    assert project_tree(cluster, outputs=[tmp_path / "elsewhere"])[1].paths >= EXPECTED  # outside: nothing to do


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
    script = frame("bin/run.sh", b"#!/bin/sh\n").replace(b'"mode": 420', b'"mode": 493')  # 0o755
    answers, code = syncd(dest, ["bin/run.sh"], script + frame("bin/b", b"") + END)
    assert code == 0, answers
    assert (dest / "bin" / "run.sh").stat().st_mode & 0o777 == 0o755 and (dest / "bin" / "b").stat().st_size == 0
    assert (dest / "bin" / "run.sh").stat().st_mtime_ns == 1_600_000_000_000_000_000


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
    assert [p.name for p in home.iterdir()] in ([], [".cache"])  # nothing synced (.cache: the node's code cache)
    answers, code = syncd("~", ["train.py"], frame("train.py", b"x") + END, env=env, home_ok=True)
    assert code == 0, answers
    assert (home / "train.py").read_bytes() == b"x"


# --- on real sshd nodes ---------------------------------------------------------------------------------------


def relative_files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if not p.is_dir()}




# --- the relay's plan ---------------------------------------------------------------------------------------------


def relay_tree(place: dict) -> dict:
    """A sender's place as {node: its peers' tree}, tokens and addresses left out."""
    return {p["node"]: relay_tree(p) for p in place.get("relay_to", [])}


def test_nodes_that_need_the_same_files_form_a_tree_four_wide_under_the_first() -> None:
    names = [f"n{i}" for i in range(23)]
    todos = {n: [("a.py", 5 << 20), ("b.py", 1)] for n in names}
    todos["n5"] = [("a.py", 5 << 20)]  # alone with its changes: straight from here
    todos["n7"] = []  # nothing to send
    addrs = {n: f"10.0.0.{i}" for i, n in enumerate(names)}
    places = relay_places(todos, addrs, None)
    assert places["n5"] == places["n7"] == {"relay_to": []}
    group = [n for n in names if n not in ("n5", "n7")]  # 21 nodes: n0, four under it, four under each of those
    assert relay_tree(places["n0"]) == {
        "n1": {"n6": {}, "n8": {}, "n9": {}, "n10": {}}, "n2": {"n11": {}, "n12": {}, "n13": {}, "n14": {}},
        "n3": {"n15": {}, "n16": {}, "n17": {}, "n18": {}}, "n4": {"n19": {}, "n20": {}, "n21": {}, "n22": {}}}
    for index, name in enumerate(group[1:], start=1):
        assert places[name]["relay_from"]["node"] == group[(index - 1) // 4]
    tokens = [places[n]["relay_from"]["token"] for n in group[1:]]
    assert len(set(tokens)) == len(tokens) and all(len(t) == 32 for t in tokens)
    # The ports come once the relayed nodes listen; a node that said none keeps None (its sender cannot connect).
    sender = with_ports(places["n0"], {n: 40000 + i for i, n in enumerate(names)} | {"n21": None})
    peers = {p["node"]: p for p in sender["relay_to"]}
    assert (peers["n1"]["addr"], peers["n1"]["port"], peers["n1"]["token"]) == (
        "10.0.0.1", 40001, places["n1"]["relay_from"]["token"])
    below = {p["node"]: p["port"] for p in peers["n4"]["relay_to"]}
    assert below == {"n19": 40019, "n20": 40020, "n21": None, "n22": 40022}
    assert relay_tree(sender) == relay_tree(places["n0"])


def test_the_relay_choice_sets_the_least_group_and_auto_relays_only_what_saves_megabytes() -> None:
    todos = {n: [("a.py", 100 << 20)] for n in ("a", "b", "c")}
    addrs = {n: n for n in "abcdefgh"}
    assert all(p == {"relay_to": []} for p in relay_places(todos, addrs, None).values())  # auto: from 4 nodes
    assert all(p == {"relay_to": []} for p in relay_places(todos, addrs, False).values())
    assert relay_tree(relay_places(todos, addrs, True)["a"]) == {"b": {}, "c": {}}
    small = {n: [("a.py", 1 << 20)] for n in "abcdefgh"}  # 7 copies of 1 MB saved: under SYNC_RELAY_MIN_SAVED
    assert all(p == {"relay_to": []} for p in relay_places(small, addrs, None).values())
    assert relay_tree(relay_places(small, addrs, True)["a"]) == {"b": {"f": {}, "g": {}, "h": {}}, "c": {}, "d": {},
                                                                    "e": {}}
    larger = {n: [("a.py", 2 << 20)] for n in "abcdefgh"}  # 14 MB saved
    assert relay_tree(relay_places(larger, addrs, None)["a"]) == relay_tree(relay_places(small, addrs, True)["a"])
    assert (asks_relay(None, 3), asks_relay(None, 4), asks_relay(True, 2), asks_relay(False, 256)) == (
        False, True, True, False)
