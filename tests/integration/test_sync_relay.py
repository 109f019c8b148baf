"""Code sync's relay: nodes pass the tree on to each other, one copy leaves this machine; a node the relay cannot
reach gets its files straight from here; a relayed stream wants its token; a relay cut short leaves nothing."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from devtools.observe import free_port
from launcher.limits import SYNC_TIMING
from tests.helpers import edit_inventory
from tests.support.project import EXPECTED, project, write
from tests.support.syncrun import END, frame, inv_in, own_workdirs, relative_files, start_syncd

RELAYED = re.compile(r"^(node-\d+): sent (\d+) file\(s\), (.+?)(?: through (node-\d+))? in [\d.]+s; (\d+) unchanged",
                     re.M)


def relayed(output: str) -> dict[str, tuple[int, str | None]]:
    """node -> (files sent, the node they came through or None), from `inv sync`'s lines."""
    return {m[1]: (int(m[2]), m[4]) for m in RELAYED.finditer(output)}


@pytest.mark.integration
def test_four_nodes_get_the_tree_through_each_other_and_one_copy_leaves_here(make_sandbox, tmp_path: Path) -> None:
    box = make_sandbox(5, master_port=free_port())
    workdirs = own_workdirs(box, tmp_path / "nodes", sync={"relay": True})  # (auto: only from 8 MB saved)
    src = project(tmp_path / "src", with_git=True)
    everything = EXPECTED | {"data/big.bin"}

    first = inv_in(src, "sync", "--hosts", str(box.inventory))
    assert first.returncode == 0, first.stdout + first.stderr
    assert relayed(first.stdout) == {"node-0": (7, None), **{f"node-{i}": (7, "node-0") for i in (1, 2, 3, 4)}}, \
        first.stdout
    size = sum((src / p).stat().st_size for p in everything)
    assert re.search(rf"synced 5/5 node\(s\) in [\d.]+s: 35 file\(s\), .* sent \({size} B from here, the rest node "
                     r"to node: 4 node\(s\) through another\)", first.stdout), first.stdout
    for w in workdirs:
        assert relative_files(w) == everything
        for path in everything:
            assert (w / path).read_bytes() == (src / path).read_bytes()
            assert (w / path).stat().st_mtime_ns == (src / path).stat().st_mtime_ns
        assert not [p for p in w.rglob(".ddp-sync.*")] and not (w / ".ddp-launcher-sync.lock").exists()

    # One node behind the others: it forms no group of its own; the four that need the same file still relay.
    write(src / "pkg" / "model.py", "W = 2  # changed\n")
    (workdirs[4] / "train.py").unlink()
    second = inv_in(src, "sync", "--hosts", str(box.inventory))
    assert second.returncode == 0, second.stdout + second.stderr
    assert relayed(second.stdout) == {"node-0": (1, None), "node-1": (1, "node-0"), "node-2": (1, "node-0"),
                                      "node-3": (1, "node-0"), "node-4": (2, None)}, second.stdout
    for w in workdirs:
        assert (w / "pkg" / "model.py").read_text() == "W = 2  # changed\n" and (w / "train.py").exists()


@pytest.mark.integration
def test_a_node_the_relay_cannot_reach_gets_its_files_straight_from_here(make_sandbox, tmp_path: Path) -> None:
    box = make_sandbox(2, master_port=free_port())
    workdirs = own_workdirs(box, tmp_path / "nodes", sync={"relay": True})
    hosts = yaml.safe_load(box.inventory.read_text())["hosts"]
    hosts[1]["addr"] = "192.0.2.1"  # how the other node reaches it: an address nobody answers (TEST-NET-1)
    edit_inventory(box.inventory, hosts=hosts)
    src = project(tmp_path / "src", with_git=True)

    t0 = time.monotonic()
    result = inv_in(src, "sync", "--hosts", str(box.inventory))
    took = time.monotonic() - t0
    assert result.returncode == 0, result.stdout + result.stderr
    assert relayed(result.stdout) == {"node-0": (7, None), "node-1": (7, None)}, result.stdout
    assert re.search(r"^node-1: sent straight from here: the relay through node-0: node-0 could not pass it on "
                     r"\(.+\); can the nodes reach each other\? sync.relay: false keeps it to SSH$", result.stdout,
                     re.M), result.stdout
    assert took < SYNC_TIMING["relay_wait_s"] + 30, took
    for w in workdirs:
        assert relative_files(w) == EXPECTED | {"data/big.bin"}


def relay_syncd(dest: Path, paths: list[str]) -> tuple[subprocess.Popen[bytes], dict]:
    """syncd asked to take part in a relay; it and its first answer."""
    proc = start_syncd(dest, paths, lock_wait=5.0, relay=True, relay_stall_s=10.0)
    assert proc.stdout
    return proc, json.loads(proc.stdout.readline())


def relayed_from(proc: subprocess.Popen[bytes], node: str, token: str) -> int:
    """Tell a relayed syncd where its stream comes from; the port it then listens on."""
    assert proc.stdin and proc.stdout
    proc.stdin.write(b'{"relay_from": {"node": "%s", "token": "%s"}}\n' % (node.encode(), token.encode()))
    proc.stdin.close()
    return int(json.loads(proc.stdout.readline())["relay_port"])


def ends(proc: subprocess.Popen[bytes]) -> tuple[list[dict], int]:
    assert proc.stdout
    return [json.loads(line) for line in proc.stdout.read().splitlines()], proc.wait(timeout=30)


@pytest.mark.integration
def test_a_relayed_node_takes_its_stream_only_with_its_token(tmp_path: Path) -> None:
    import socket

    seed, first = relay_syncd(tmp_path / "a", ["x.py", "big.bin"])
    peer, answer = relay_syncd(tmp_path / "b", ["x.py", "big.bin"])
    assert first["manifest"] == answer["manifest"] == {}
    port = relayed_from(peer, "node-a", "right")
    with socket.create_connection(("127.0.0.1", port)) as stranger:  # dropped, and nothing lands
        stranger.sendall(b'{"token": "wrong", "relay_to": []}\n' + frame("evil.py", b"x") + END)
        assert stranger.recv(1) == b""
    big = os.urandom(3 << 20)  # more than a socket buffer holds: the relay passes it on as it reads
    assert seed.stdin
    seed.stdin.write(b'{"relay_to": [{"node": "node-b", "addr": "127.0.0.1", "port": %d, "token": "right", '
                     b'"relay_to": []}]}\n' % port + frame("x.py", b"print(1)\n")
                     + frame("big.bin", big) + END)
    seed.stdin.close()
    assert ends(seed) == ([{"ok": True, "entries": 2, "bytes": len(big) + 9, "relayed_to": ["node-b"],
                            "unreached": []}], 0)
    assert ends(peer) == ([{"ok": True, "entries": 2, "bytes": len(big) + 9, "relayed_to": [], "unreached": []}], 0)
    for dest in (tmp_path / "a", tmp_path / "b"):
        assert (dest / "big.bin").read_bytes() == big and (dest / "x.py").read_bytes() == b"print(1)\n"
        assert sorted(p.name for p in dest.iterdir()) == ["big.bin", "x.py"]


@pytest.mark.integration
def test_a_relay_cut_short_leaves_nothing_on_the_node_after_it(tmp_path: Path) -> None:
    seed, _ = relay_syncd(tmp_path / "a", ["x.py", "big.bin"])
    peer, _ = relay_syncd(tmp_path / "b", ["x.py", "big.bin"])
    port = relayed_from(peer, "node-a", "right")
    assert seed.stdin
    seed.stdin.write(b'{"relay_to": [{"node": "node-b", "addr": "127.0.0.1", "port": %d, "token": "right", '
                     b'"relay_to": []}]}\n' % port + frame("x.py", b"print(1)\n")
                     + frame("big.bin", os.urandom(1 << 20))[:-1000])
    seed.stdin.close()  # the controller's stream stops in the middle of big.bin
    answers, code = ends(seed)
    assert code == 1 and "the stream ended in the middle of big.bin" in answers[-1]["error"], answers
    answers, code = ends(peer)
    assert code == 1 and answers[-1]["error"].startswith("the stream relayed through node-a broke off: "), answers
    assert not (tmp_path / "b").exists() and not (tmp_path / "a").exists()  # the folders the failed syncs made too


@pytest.mark.integration
def test_nodes_sharing_one_workdir_take_turns_without_waiting_on_each_other(make_sandbox, tmp_path: Path) -> None:
    box = make_sandbox(3, master_port=free_port())
    shared = tmp_path / "nfs" / "work"  # one folder for all three, as an NFS home gives
    edit_inventory(box.inventory, hosts=[{"name": f"node-{i}", "workdir": str(shared)} for i in range(3)],
                   sync={"relay": True})
    src = project(tmp_path / "src", with_git=True)

    t0 = time.monotonic()
    result = inv_in(src, "sync", "--hosts", str(box.inventory))
    took = time.monotonic() - t0
    assert result.returncode == 0, result.stdout + result.stderr
    counts = sorted(files for files, _ in relayed(result.stdout).values())
    assert counts == [0, 0, 7], result.stdout  # the first to hold the lock sends; the others find it all there
    assert took < 30, took  # not the lock's 60 s wait: the others' turns do not wait for the relay's plan
    assert relative_files(shared) == EXPECTED | {"data/big.bin"}
