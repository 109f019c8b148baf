"""Setup lines (`setup:`) run in the node's shell before every node program, in the shell that then starts it.

Unit tests run the node command under a local `sh`, as a node's login shell would; the integration tests use real
sshd nodes: an activated venv makes a bare `python` the venv's for the doctor's probe, the agent and torchrun alike,
and a failing line stops the launch with that node's words before anything starts.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.config.model import Host
from launcher.transport.program import SETUP_FAILED, host_command, program_input, python_command

ECHO = ("import sys, json, os\nr = json.loads(sys.stdin.readline())\n"
        "print(json.dumps({'exe': sys.executable, 'r': r, 'x': os.environ.get('X')}))\n")
"""A node program that answers with its interpreter, its request and $X."""


def run_local(command: str, request: dict | None = None, cwd: Path | None = None
              ) -> subprocess.CompletedProcess[bytes]:
    """`command` under `sh -c`, the echo program and `request` on its stdin, as a node's shell gets them."""
    return subprocess.run(["sh", "-c", command], input=program_input(ECHO, request or {"a": 1}), capture_output=True,
                          cwd=cwd, timeout=60, check=False)


def test_without_setup_the_command_is_the_interpreter_alone_in_place_of_the_shell() -> None:
    # exec: the node program alone holds the session's pipes (a supervisor that lets its console go ends its output)
    assert python_command("/opt/venv/bin/python") == python_command("/opt/venv/bin/python", ())
    assert python_command("/opt/venv/bin/python").startswith("exec /opt/venv/bin/python -S -c 'import sys,zlib,")
    assert python_command("python3") == ("exec python3 -S -c 'import sys,zlib,binascii;exec(zlib.decompress("
                                         "binascii.a2b_base64(sys.stdin.readline())))' 3>&2")


def test_host_command_is_the_hosts_setup_then_its_python() -> None:
    host = Host(name="n", addr="n", python="~/env/bin/python", workdir="~", nproc_per_node=1,
                setup=("export X=1",))
    assert host_command(host) == python_command("~/env/bin/python", ("export X=1",))
    assert host_command(host).endswith("exec \"$HOME\"/env/bin/python -S -c 'import sys,zlib,binascii;exec("
                                       "zlib.decompress(binascii.a2b_base64(sys.stdin.readline())))' 3>&2")


def test_setup_lines_run_in_the_shell_that_then_runs_the_program() -> None:
    result = run_local(python_command(sys.executable, ("export X=from-setup", "true")))
    assert result.returncode == 0, result.stderr
    answer = json.loads(result.stdout)
    assert answer == {"exe": sys.executable, "r": {"a": 1}, "x": "from-setup"}


def test_setup_output_goes_to_stderr_and_setup_never_reads_the_program() -> None:
    """stdout carries the node program's answer (its last line is parsed); the program arrives on stdin."""
    result = run_local(python_command(sys.executable, ("echo said-by-setup", "cat", "read line || true")))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["r"] == {"a": 1}  # one line, the program's: neither cat nor read ate stdin
    assert result.stderr == b"said-by-setup\n"


@pytest.mark.parametrize(("lines", "failed", "expected"), [
    (["export X=1", "false", "echo never"], "setup line 2 of 3 failed with exit code 1, so nothing was started on "
                                             "this node: false", b""),
    (["no-such-command-here --x"], "setup line 1 of 1 failed with exit code 127, so nothing was started on this "
                                   "node: no-such-command-here --x", b"no-such-command-here: not found"),
    (["(exit 3)"], "setup line 1 of 1 failed with exit code 3, so nothing was started on this node: (exit 3)", b""),
])
def test_a_failing_line_stops_the_command_with_the_shells_words_and_a_sentence(
        lines: list[str], failed: str, expected: bytes) -> None:
    result = run_local(python_command(sys.executable, lines))
    assert result.returncode == SETUP_FAILED
    assert result.stdout == b""  # the program never ran
    *before, last = result.stderr.decode().splitlines()
    assert last == failed
    assert expected in "\n".join(before).encode()
    assert b"never" not in result.stderr


@pytest.mark.parametrize("line", [
    "false 'it''s' \"$(echo once >> count)\"",  # the line runs once; its copy in the message is only printed
    "false %s%d%% \\n",
    "false '; rm -rf /'",
    "false `echo once >> count`",
])
def test_the_failing_lines_copy_in_the_message_is_printed_never_run(line: str, tmp_path: Path) -> None:
    result = run_local(python_command(sys.executable, [line]), cwd=tmp_path)
    assert result.returncode == SETUP_FAILED
    assert result.stderr.decode().splitlines()[-1].endswith(f"nothing was started on this node: {line}")
    if "count" in line:
        assert (tmp_path / "count").read_text() == "once\n"


def test_a_tilde_interpreter_after_setup_is_the_nodes_home(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / "env" / "bin").mkdir(parents=True)
    (home / "env" / "bin" / "python").symlink_to(sys.executable)
    result = subprocess.run(["/bin/sh", "-c", python_command("~/env/bin/python", ("true",))],
                            input=program_input(ECHO, {}), capture_output=True, env={"HOME": str(home), "PATH": ""},
                            timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["exe"] == str(home / "env" / "bin" / "python")


# --- on real sshd nodes ----------------------------------------------------------------------------------------


