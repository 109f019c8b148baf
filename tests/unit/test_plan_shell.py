"""The launch plan's shell line and quoted paths: every word round-trips, and a real shell reads what the plan meant."""

from __future__ import annotations

import dataclasses
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.config.model import EnvVar, Job
from launcher.plan.launchplan import NodeCommand, plan_launch, quote_path
from tests.support.plans import HEAD, HETERO, NASTY_WORDS, ORDER_TEXT, as_shell_reads, cluster


def after_cd(node: NodeCommand) -> list[str]:
    """The words of `shell_line()` after `cd <workdir> && env -u RANK ... NAME=value...` (a node without setup,
    forwarded variables, env file or socket interface)."""
    assert not (node.setup or node.forward_env or node.env_file or node.socket_ifname), node
    argv = shlex.split(node.shell_line())
    assert argv[0] == "cd" and argv[2] == "&&", argv
    argv = argv[3:]
    assert argv[:1 + len(HEAD)] == ["env", *HEAD], argv
    argv = argv[1 + len(HEAD) + len(node.env):]
    assert argv[:len(node.launcher_env)] == [f"{k}={v}" for k, v in node.launcher_env], argv
    return argv[len(node.launcher_env):]


@pytest.mark.parametrize("word", NASTY_WORDS)
def test_shell_line_round_trips_every_word(word: str) -> None:
    c = cluster("hosts: [{name: a, workdir: '~/dir with space'}]\n")
    host = dataclasses.replace(c.hosts[0], env=(EnvVar("PLAIN", value=word), EnvVar("OTHER", value=word)))
    c = dataclasses.replace(c, hosts=(host,))
    job = Job(script="t.py" if not word or word.startswith("-") else word, args=(word, f"--opt={word}", word))
    node = plan_launch(c, job, run_id="r").nodes[0]
    assert after_cd(node) == as_shell_reads(node)
    argv = shlex.split(node.shell_line())
    assert argv[:5 + len(HEAD)] == ["cd", "$HOME/dir with space", "&&", "env", *HEAD, f"PLAIN={word}"]
    assert argv[5 + len(HEAD)] == f"OTHER={word}"


def test_shell_line_without_env_has_only_the_unsets() -> None:
    node = plan_launch(cluster(HETERO), run_id="r").nodes[0]
    assert node.shell_line().startswith(
        'cd "$HOME"/project && env -u RANK -u LOCAL_RANK -u WORLD_SIZE -u LOCAL_WORLD_SIZE -u GROUP_RANK -u ROLE_RANK '
        "-u ROLE_WORLD_SIZE -u GROUP_WORLD_SIZE -u NODE_RANK -u MASTER_ADDR -u MASTER_PORT "
        f"{ORDER_TEXT} /opt/venv/bin/python -m torch.distributed.run ")
    assert after_cd(node) == as_shell_reads(node)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.text(alphabet=st.characters(exclude_characters="\0", exclude_categories=["Cs"])), max_size=5))
def test_shell_line_round_trips_any_args(args: list[str]) -> None:
    node = plan_launch(cluster("hosts: [a]\n"), Job("t.py", tuple(args)), run_id="r").nodes[0]
    assert after_cd(node) == as_shell_reads(node)


@pytest.mark.skipif(shutil.which("sh") is None, reason="needs a POSIX sh")
def test_a_real_shell_reads_the_same_words(tmp_path: Path) -> None:
    """What `sh` makes of the line (not only shlex): the words, the directory, the environment torchrun would get
    (stale ranks gone), nothing executed by accident."""
    (tmp_path / "my project").mkdir()
    c = cluster("hosts: [{name: a, workdir: '~/my project', env: {GREETING: 'hi $(touch pwned) `touch pwned`'}}]\n")
    args = tuple(w for w in NASTY_WORDS if w)
    node = plan_launch(c, Job("t.py", args), run_id="r").nodes[0]
    line = node.shell_line()
    # Put a printer before the program, keeping the shell's parsing of everything else.
    printer = """sh -c 'printf "%s\\0" "${RANK-unset}" "${MASTER_ADDR-unset}" "$GREETING" "$@"' printer """
    line = line.replace("&& env ", "&& pwd && env ", 1).replace(" python3 -m ", f" {printer}python3 -m ", 1)
    out = subprocess.run(["sh", "-c", line], capture_output=True, cwd=tmp_path, check=True, timeout=10,
                         env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin", "RANK": "7", "MASTER_ADDR": "stale"},
                         ).stdout.decode()
    where, _, printed = out.partition("\n")
    assert where == str(tmp_path / "my project")
    home = [str(tmp_path) + w[1:] if i in node.home_args and w.startswith("~/") else w  # `~/`: the home
            for i, w in enumerate(node.argv)]
    assert printed.split("\0")[:-1] == ["unset", "unset", node.env[0].value, *home]
    assert not list(tmp_path.rglob("pwned"))


# --- quote_path ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("path", "quoted"), [
    ("~", '"$HOME"'),
    ("~/x", '"$HOME"/x'),
    ("~/my project", "\"$HOME\"/'my project'"),
    ("~/$(id)", "\"$HOME\"/'$(id)'"),
    ("/opt/venv/bin/python", "/opt/venv/bin/python"),
    ("/a b/c", "'/a b/c'"),
    ("relative/dir", "relative/dir"),
    ("~user/x", "'~user/x'"),
    ("~x", "'~x'"),
    ("$HOME/x", "'$HOME/x'"),
    ("it's", "'it'\"'\"'s'"),
    ("/a;rm -rf /", "'/a;rm -rf /'"),
])
def test_quote_path(path: str, quoted: str) -> None:
    assert quote_path(path) == quoted


@pytest.mark.skipif(shutil.which("sh") is None, reason="needs a POSIX sh")
@pytest.mark.parametrize(("path", "expected"), [
    ("~", "{home}"),
    ("~/x", "{home}/x"),
    ("~/my project/$(touch pwned)", "{home}/my project/$(touch pwned)"),
    ("~user/x", "~user/x"),
    ("$HOME/x", "$HOME/x"),
    ("/a b/`touch pwned`", "/a b/`touch pwned`"),
])
def test_quote_path_means_the_same_to_a_real_shell(tmp_path: Path, path: str, expected: str) -> None:
    home = tmp_path / "home dir"
    home.mkdir()
    out = subprocess.run(["sh", "-c", f"printf '%s' {quote_path(path)}"], capture_output=True, check=True,
                         env={"HOME": str(home), "PATH": "/usr/bin:/bin"}, cwd=tmp_path, timeout=10).stdout.decode()
    assert out == expected.format(home=home)
    assert not list(tmp_path.rglob("pwned"))
