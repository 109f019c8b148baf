"""The node modules' compiled code, kept in each node's cache (launcher/node/loader.py): a node program run a
second time takes its modules from there, and anything wrong with that folder costs a compile, never the run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from launcher.limits import NODE_CODE_CACHE
from launcher.run import actions as run_actions
from launcher.transport.program import _module, _node_sources, program_line, python_command
from tests.support.nodeenv import node_python


def run_node(stdin: bytes, cache: Path, python: str | None = None) -> subprocess.CompletedProcess[bytes]:
    """`PYTHON -S -c BOOTSTRAP` through a shell, as the launcher starts every node program, with its own cache home."""
    env = {**os.environ, "XDG_CACHE_HOME": str(cache)}
    return subprocess.run(["sh", "-c", python_command(python or node_python())], input=stdin,
                          capture_output=True, env=env, timeout=60)


def runs(cache: Path) -> dict:
    result = run_node(run_actions.agent_input({"action": "runs", "node": "node-0"}), cache)
    assert result.returncode == 0, result.stderr.decode()
    return json.loads(result.stdout.decode().splitlines()[-1])


def entries(cache: Path) -> dict[str, float]:
    folder = cache / Path(str(NODE_CODE_CACHE["root"])).relative_to("~/.cache")
    return {p.name: p.stat().st_mtime for p in folder.iterdir()} if folder.exists() else {}


def test_a_second_run_takes_the_modules_it_imports_from_the_cache(tmp_path: Path) -> None:
    assert runs(tmp_path) == {"runs": []}
    first = entries(tmp_path)
    # One entry per module the `runs` action imported (the agent and what it imports at its top), none of the rest.
    names = {name.split(".")[0] for name in first}
    sent = {digest for _, _, digest in _node_sources()[1].values()}
    assert len(first) >= 4 and names <= sent
    assert all(name.endswith(".code") for name in first)
    time.sleep(0.05)
    assert runs(tmp_path) == {"runs": []}
    assert entries(tmp_path) == first  # nothing compiled or written again


def test_a_damaged_entry_is_compiled_again_and_mended(tmp_path: Path) -> None:
    runs(tmp_path)
    folder = tmp_path / "ddp-launcher" / "code"
    damaged = sorted(folder.iterdir())[0]
    good = damaged.read_bytes()
    damaged.write_bytes(b"\x00not marshal data")
    assert runs(tmp_path) == {"runs": []}
    assert damaged.read_bytes() == good  # compiled again, and the entry mended


def test_a_cache_that_cannot_be_written_costs_a_compile_only(tmp_path: Path) -> None:
    (tmp_path / "ddp-launcher").mkdir()
    (tmp_path / "ddp-launcher" / "code").write_text("a file where the folder would be")
    assert runs(tmp_path) == {"runs": []}
    assert [p.name for p in (tmp_path / "ddp-launcher").iterdir()] == ["code"]  # no temporary file left


def test_entries_not_written_for_long_go_when_a_new_one_is_stored(tmp_path: Path) -> None:
    folder = tmp_path / "ddp-launcher" / "code"
    folder.mkdir(parents=True)
    old, recent = folder / ("0" * 32 + ".cpython-00.code"), folder / ("1" * 32 + ".cpython-00.code")
    for path in (old, recent):
        path.write_bytes(b"x")
    long_ago = time.time() - float(NODE_CODE_CACHE["keep_s"]) - 3600
    os.utime(old, (long_ago, long_ago))
    runs(tmp_path)
    assert not old.exists() and recent.exists()


def test_a_traceback_from_cached_code_names_the_file_and_line(tmp_path: Path) -> None:
    source = "def main():\n    value = 1\n    raise ValueError('from the node: %d' % value)\n"
    loader, modules = _node_sources()
    sent = {name: modules[name] for name in ("launcher", "launcher.node")}
    sent["launcher.node.boom"] = _module("launcher/node/boom.py", source)
    program = f"{loader}\nrun('launcher.node.boom', {json.dumps(sent)}, {json.dumps(NODE_CODE_CACHE)})\n"
    for _ in range(2):  # compiled and stored, then taken from the cache
        result = run_node(program_line(program).encode() + b"\n", tmp_path, python=sys.executable)
        err = result.stderr.decode()
        assert result.returncode == 1 and 'File "launcher/node/boom.py", line 3, in main' in err, err
        assert "ValueError: from the node: 1" in err
    assert any(name.startswith(sent["launcher.node.boom"][2]) for name in entries(tmp_path))


def test_a_sub_package_is_served_and_its_traceback_names_its_files(tmp_path: Path) -> None:
    entry = ("from launcher.node.pkg import deep\n\n\ndef main():\n    import launcher.node.pkg as pkg\n"
             "    assert pkg.__path__ == ['launcher/node/pkg'] and pkg.__loader__.is_package('launcher.node.pkg')\n"
             "    assert not pkg.__loader__.is_package('launcher.node.pkg.deep')\n    deep.fail()\n")
    loader, modules = _node_sources()
    sent = {name: modules[name] for name in ("launcher", "launcher.node")}
    sent["launcher.node.pkg"] = _module("launcher/node/pkg/__init__.py", '"""A folder of the node package."""\n')
    sent["launcher.node.pkg.entry"] = _module("launcher/node/pkg/entry.py", entry)
    sent["launcher.node.pkg.deep"] = _module("launcher/node/pkg/deep.py", "def fail():\n    raise ValueError('deep')\n")
    program = f"{loader}\nrun('launcher.node.pkg.entry', {json.dumps(sent)}, {json.dumps(NODE_CODE_CACHE)})\n"
    result = run_node(program_line(program).encode() + b"\n", tmp_path, python=sys.executable)
    err = result.stderr.decode()
    assert result.returncode == 1 and 'File "launcher/node/pkg/entry.py", line 8, in main' in err, err
    assert 'File "launcher/node/pkg/deep.py", line 2, in fail' in err and "ValueError: deep" in err
