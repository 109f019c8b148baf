"""torchrun's start without subprocess (launcher/node/common/child.py): what Popen gave the run, the child still gets.

Each case starts its child from a fresh Python (the start moves that process to the run's folder and marks its
descriptors non-inheritable, as the supervisor it is), with SIGPIPE ignored there as in any Python."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.node.common.child import which
from tests.helpers import REPO

STARTER = """
import json, os, sys
from launcher.node.common import child
spec = json.loads(sys.argv[1])
keep_r, keep_w = os.pipe()
os.set_inheritable(keep_w, True)  # as the shell's `3>&2` gives the agent its events' fd
with open(spec["log"], "ab") as log:
    try:
        proc = child.start(spec["argv"], spec["cwd"], dict(os.environ, **spec["env"]), log.fileno())
    except OSError as exc:
        print(json.dumps({"error": str(exc)}))
        sys.exit(0)
print(json.dumps({"pid": proc.pid, "polled": proc.poll(), "code": proc.wait(), "again": proc.poll(),
                  "kind": type(proc).__name__, "open_fd": keep_w}))
"""


def start(tmp_path: Path, argv: list[str], cwd: Path | None = None, **env: str) -> tuple[dict, str]:
    log = tmp_path / "log"
    spec = {"argv": argv, "cwd": str(cwd or tmp_path), "env": env, "log": str(log)}
    done = subprocess.run([sys.executable, "-c", STARTER, json.dumps(spec)], cwd=REPO, capture_output=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=60, check=True)
    return json.loads(done.stdout), log.read_text() if log.exists() else ""


def test_the_child_runs_in_its_folder_with_its_output_in_the_log_and_its_exit_code(tmp_path: Path) -> None:
    answer, log = start(tmp_path, ["sh", "-c", "pwd; echo err >&2; read x; echo \"stdin [$x]\"; exit 7"])
    assert answer["kind"] == "Child" and answer["code"] == 7 and answer["again"] == 7
    assert log.splitlines() == [str(tmp_path), "err", "stdin []"]  # stdin is /dev/null


def test_a_signal_gives_minus_its_number_as_popen_does(tmp_path: Path) -> None:
    answer, _ = start(tmp_path, ["sh", "-c", "kill -9 $$"])
    assert answer["code"] == -9


def test_the_child_has_its_own_session_sigpipe_back_and_none_of_the_agents_descriptors(tmp_path: Path) -> None:
    """A job's pipeline (`yes | head -1`) ends quietly, as under a shell, not with `yes: write error`."""
    script = ('echo "$$ $(ps -o sid= -p $$)"; grep SigIgn /proc/$$/status; ls /proc/$$/fd | tr "\\n" " "; echo; '
              "yes | head -1")
    answer, log = start(tmp_path, ["sh", "-c", script])
    pid_sid, ignored, fds, yes_line, *rest = log.splitlines()
    pid, sid = pid_sid.split()
    assert pid == sid  # a session of its own: the stop signals its group
    assert int(ignored.split()[1], 16) & (1 << (13 - 1)) == 0  # SIGPIPE not ignored
    assert str(answer["open_fd"]) not in fds.split() and yes_line == "y" and rest == [], log


def test_the_program_is_found_on_the_childs_path_and_relative_to_its_folder(tmp_path: Path) -> None:
    tools = tmp_path / "tools"
    tools.mkdir()
    program = tools / "mytool"
    program.write_text("#!/bin/sh\necho mytool ran in $(pwd)\n")
    program.chmod(0o755)
    answer, log = start(tmp_path, ["mytool"], PATH=f"{tools}:/usr/bin:/bin")
    assert answer["code"] == 0 and log == f"mytool ran in {tmp_path}\n"
    answer, log = start(tmp_path, ["tools/mytool"])  # a relative program means the run's folder, as with Popen
    assert answer["code"] == 0


@pytest.mark.parametrize(("argv", "folder", "says"), [
    (["no-such-program-here"], None, "No such file or directory: 'no-such-program-here'"),
    (["true"], "missing", "No such file or directory"),
])
def test_what_cannot_start_raises_oserror_as_popen_did(tmp_path: Path, argv: list[str], folder: str | None,
                                                      says: str) -> None:
    answer, _ = start(tmp_path, argv, tmp_path / folder if folder else None)
    assert says in answer["error"], answer


def test_which_answers_as_shutil_which(tmp_path: Path) -> None:
    import shutil

    for name in ("sh", "python3", "no-such-program-here"):
        assert which(name, os.environ.get("PATH")) == shutil.which(name)
    plain = tmp_path / "plain"
    plain.write_text("")
    assert which(str(plain), None) is None and which(str(tmp_path), None) is None  # not executable; a folder
