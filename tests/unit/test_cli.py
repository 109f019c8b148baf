"""Wrong command-line input gets one sentence and a non-zero exit, before anything connects or starts."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from invoke import Program
from rich.console import Console

from launcher import app, options
from launcher.errors import LauncherError
from launcher.report.states import state_table
from launcher.run import control as run_control
from launcher.run.run_io import RunIO
from launcher.settings import (
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_PROBE_TIMEOUT,
    DEFAULT_SILENCE_TIMEOUT,
    GROUP_OF,
    Settings,
)
from tests.helpers import REPO, inv

EXAMPLE = ["--hosts", "hosts/example.yaml"]


@pytest.mark.parametrize(("args", "code", "message"), [
    (["launch", "--hosts", "hosts/no-such.yaml"], 1, "hosts/no-such.yaml: no such file"),
    (["launch", *EXAMPLE, "--connect-timeout", "soon"], 2,
     "error: --connect-timeout must be a number of seconds, got 'soon'"),
    (["launch", *EXAMPLE, "--connect-timeout", "abc"], 2,
     "error: --connect-timeout must be a number of seconds, got 'abc'"),
    (["launch", *EXAMPLE, "--grace", "-1"], 2, "error: --grace must be from 0 to 86400 seconds, got '-1'"),
    (["launch", *EXAMPLE, "--grace", "nan"], 2, "error: --grace must be a finite number of seconds, got 'nan'"),
    (["launch", *EXAMPLE, "--grace", "inf"], 2, "error: --grace must be a finite number of seconds, got 'inf'"),
    (["launch", *EXAMPLE, "--silence-timeout", "0"], 2,
     "error: --silence-timeout must be from 1 to 86400 seconds, got '0'"),
    (["launch", *EXAMPLE, "--heartbeat-timeout", "soon"], 2,
     "error: --heartbeat-timeout must be a number of seconds, got 'soon'"),
    (["stop", *EXAMPLE, "--grace", "nan"], 2, "error: --grace must be a finite number of seconds, got 'nan'"),
    (["doctor", *EXAMPLE, "--connect-timeout", "-5"], 2,
     "error: --connect-timeout must be from 0.1 to 86400 seconds, got '-5'"),
    (["doctor", *EXAMPLE, "--probe-timeout", "0"], 2,
     "error: --probe-timeout must be from 0.1 to 86400 seconds, got '0'"),
    (["doctor", *EXAMPLE, "--probe-timeout", "soon"], 2,
     "error: --probe-timeout must be a number of seconds, got 'soon'"),
    (["launch", *EXAMPLE, "--probe-timeout", "inf"], 2,
     "error: --probe-timeout must be a finite number of seconds, got 'inf'"),
    (["launch", *EXAMPLE, "--probe-timeout", "1e10"], 2,  # select() would overflow on the node
     "error: --probe-timeout must be from 0.1 to 86400 seconds, got '1e10'"),
    (["launch", *EXAMPLE, "--heartbeat-timeout", "1e-9"], 2,  # beats every 0.25 ns: a busy loop
     "error: --heartbeat-timeout must be 0 (no bound) or from 1 to 86400 seconds, got '1e-9'"),
    (["launch", *EXAMPLE, "--retries", "1000000000"], 2, "error: --retries must be from 0 to 1000, got '1000000000'"),
    (["stop", *EXAMPLE, "--grace", "1e10"], 2, "error: --grace must be from 0 to 86400 seconds, got '1e10'"),
    (["launch", *EXAMPLE, "--args", "'unclosed"], 1, "--args: cannot split"),
    (["launch", *EXAMPLE, "--script", "--evil"], 1, "starts with '-'"),
    (["logs", *EXAMPLE, "--rank", "three"], 2, "error: --rank must be a whole number, got 'three'"),
    (["logs", *EXAMPLE, "--node", "nope"], 1, "no host named 'nope'"),
    (["doctor", *EXAMPLE, "--slurm", "--include", "node-1"], 2, "error: --include does not apply to --slurm"),
    (["doctor", *EXAMPLE, "--job", "12", "--slurm"], 2, "error: --slurm does not apply to a SLURM job (--job)"),
    (["doctor", *EXAMPLE, "--slurm"], 1, "--slurm runs inside a SLURM allocation (SLURM_JOB_ID is not set)"),
    (["top", *EXAMPLE, "--json"], 2, "error: --json goes with --once (the live view is for a terminal)"),
    (["sandbox.up", "--nodes", "0"], 2, "error: --nodes must be at least 1"),
    (["sandbox.up", "--nproc-per-node", "100000000"], 2,
     "error: --nproc-per-node must be at most 1024, got 100000000"),
])
def test_bad_options_get_one_sentence(args: list[str], code: int, message: str) -> None:
    result = inv(*args, timeout=60)
    assert result.returncode == code, result.stderr
    assert message in result.stderr, result.stderr
    assert "Traceback" not in result.stderr + result.stdout


@pytest.mark.parametrize("task", ["stop", "status", "logs", "stacks", "top"])
@pytest.mark.parametrize("run", ["../../x", "x[/]", "20261122-031500-A1B2C3", "20261122-031500-a1b2c3/.."])
def test_run_must_be_a_run_id(task: str, run: str) -> None:
    """Checked before the inventory is read or any node contacted: a missing inventory is not even noticed."""
    result = inv(task, "--hosts", "hosts/no-such.yaml", "--run", run, timeout=60)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == f"error: --run must be a run id like 20261122-031500-a1b2c3, got {run!r}"
    assert result.stdout == ""


@pytest.mark.parametrize(("variable", "value", "message"), [
    ("GRACE", "nan", "launcher.grace must be a finite number of seconds, got 'nan'"),
    ("GRACE", "-inf", "launcher.grace must be a finite number of seconds, got '-inf'"),
    ("CONNECT_TIMEOUT", "0", "launcher.connect_timeout must be from 0.1 to 86400 seconds, got '0.0'"),
    ("PROBE_TIMEOUT", "-1", "launcher.probe_timeout must be from 0.1 to 86400 seconds, got '-1.0'"),
    ("CONSOLE_BUFFER", "0", "launcher.console_buffer must be from 1 to 100000000, got '0'"),
    ("STRAGGLER_FACTOR", "2", "launcher.straggler_factor must be from 0.01 to 1, got '2.0'"),
    ("STRAGGLER_FACTOR", "nan", "launcher.straggler_factor must be a finite number, got 'nan'"),
    ("STRAGGLER_HOLD", "-1", "launcher.straggler_hold must be from 0 to 86400 seconds, got '-1.0'"),
])
def test_bad_config_value_gets_one_sentence(variable: str, value: str, message: str) -> None:
    """Invoke reads INVOKE_LAUNCHER_X as config, like a value written in invoke.yaml."""
    result = inv("status", *EXAMPLE, env={f"INVOKE_LAUNCHER_{variable}": value}, timeout=60)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == f"error: invoke.yaml: {message}"
    assert "Traceback" not in result.stderr + result.stdout


def test_unknown_config_key_in_a_config_file(tmp_path: Path) -> None:
    """A misspelt key in an Invoke config file (here a runtime one, `-f`) is named with the keys that exist."""
    config = tmp_path / "conf.yaml"
    config.write_text("launcher:\n  gracee: 5\n")
    result = inv("-f", str(config), "status", *EXAMPLE, timeout=60)
    assert result.returncode == 2, result.stderr
    assert "error: invoke.yaml: launcher.gracee: unknown key; known keys: hosts, log_dir, grace" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout


def test_unknown_config_key() -> None:
    with pytest.raises(LauncherError, match=r"^invoke.yaml: launcher.gracee: unknown key; known keys: hosts, "):
        options.from_config({"gracee": 5}, {})


def test_the_defaults_live_in_options_and_invoke_yaml_changes_nothing() -> None:
    """settings.py is the defaults' one home: Invoke's collection takes them from there (with their types, for
    INVOKE_LAUNCHER_* casts), and invoke.yaml only shows, commented, what a user may change."""
    import tasks

    assert yaml.safe_load((REPO / "invoke.yaml").read_text()) is None  # every line a comment
    collection = tasks.ns.configuration()["launcher"]
    defaults = {name: Settings().value(name) for name in GROUP_OF}
    assert set(collection) == set(options.CONFIG_KEYS)
    assert collection.pop("hosts") == options.DEFAULT_HOSTS
    assert Path(collection.pop("log_dir")) == defaults["log_dir"]
    for key, value in collection.items():
        assert value == defaults[key] and type(value) is type(defaults[key]), key
    shown = {line.split(":")[0].strip("# ") for line in (REPO / "invoke.yaml").read_text().splitlines()
             if line.startswith("#   ") and ":" in line and not line.startswith("#     ")}
    assert set(options.CONFIG_KEYS) <= shown


def test_probe_timeout_is_an_option_of_its_own() -> None:
    """The connect timeout bounds SSH set-up only; the probe's answer has its own, longer limit."""
    assert DEFAULT_PROBE_TIMEOUT > DEFAULT_CONNECT_TIMEOUT
    assert "probe_timeout" in options.CONFIG_KEYS
    settings = options.from_config({"probe_timeout": 60.0}, {"connect_timeout": "5"})
    assert (settings.run.probe_timeout, settings.ssh.connect_timeout) == (60.0, 5.0)
    assert options.from_config({}, {"probe_timeout": "30"}).run.probe_timeout == 30.0
    with pytest.raises(LauncherError,
                       match=r"^invoke.yaml: launcher.probe_timeout must be from 0.1 to 86400 seconds, got '0'$"):
        options.from_config({"probe_timeout": 0}, {})


def test_command_line_overrides_config() -> None:
    settings = options.from_config({"grace": 10.0, "log_dir": "somewhere"}, {"grace": "2.5", "silence_timeout": None})
    assert (settings.run.grace, settings.run.silence_timeout, settings.output.log_dir) == (
        2.5, DEFAULT_SILENCE_TIMEOUT, Path("somewhere"))
    assert settings.sources == {"grace": "--grace", "log_dir": "invoke.yaml"}


def _render(renderable: object) -> str:
    out = io.StringIO()
    Console(file=out, width=200, color_system=None).print(renderable)
    return out.getvalue()


def test_state_table_prints_markup_as_text() -> None:
    states = [run_control.NodeState("x[/]y", "running", "r[bold]1[/]", exit_code=None, found=1),
              run_control.NodeState("[red]n2", "[/]", None, exit_code=3)]
    text = _render(state_table("stop run [/]x", states, stop=True))
    for shown in ("stop run [/]x", "x[/]y", "r[bold]1[/]", "[red]n2", "[/]"):
        assert shown in text, text


@pytest.mark.parametrize("task", ["status", "stop"])
def test_status_and_stop_print_node_text_as_is(task: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """What nodes answer (run id, state, detail) reaches the console unchanged, through the task's own printing."""
    found = 1 if task == "stop" else 0
    states = [run_control.NodeState("n[/]1", "stopped", "id[/]", found=found, detail="odd [/] detail"),
              run_control.NodeState("n2", "none", "id[/]")]
    monkeypatch.setattr(app.runs, "load_inventory", lambda hosts: None)
    monkeypatch.setattr(run_control, task, lambda cluster, run_id, settings, **_: states)
    out = io.StringIO()
    # page=False: a status that finds the run over would start the page's own process (into ./logs, as a user's)
    settings = Settings.of(page=False)
    getattr(app, task)("hosts.yaml", "20261122-031500-a1b2c3", settings, run_io=RunIO(out=out))
    text = out.getvalue()
    assert "n[/]1: odd [/] detail" in text
    assert "id[/]" in text
    assert "n[/]1" in text


def test_stop_says_nothing_was_running_as_is(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(app.runs, "load_inventory", lambda hosts: None)
    states = [run_control.NodeState("n1", "none", "x[/]")]
    monkeypatch.setattr(run_control, "stop", lambda cluster, run_id, settings, **_: states)
    out = io.StringIO()
    assert app.stop("hosts.yaml", None, Settings(), run_io=RunIO(out=out)) == 0
    assert out.getvalue().strip() == "nothing was running on 1 node(s) (run x[/])"


def test_no_task_has_a_short_flag_and_every_option_shows_its_name() -> None:
    """Invoke's automatic short flags gave `-e` two meanings (--detach, --exclude) and --hang-timeout a `--=STRING`;
    the one short flag is `-v`, --verbose's, where a task has it."""
    import tasks

    # Invoke's Task.arg_opts pops each option's help from the task as it parses: put it back after, for the tests that
    # read it in this same process (tests/unit/test_doctor.py's fast checks, when xdist runs it here after this one).
    helps = {name: dict(tasks.ns[name].help) for name in tasks.ns.task_names}
    try:
        for name in tasks.ns.task_names:  # Invoke's own Program in this process: the help `inv` prints, 0.4 s less
            shown = io.StringIO()
            with contextlib.redirect_stdout(shown):
                Program(namespace=tasks.ns, binary="inv").run(["inv", name, "--help"], exit=False)
            lines = shown.getvalue().split("Options:", 1)[1].splitlines()
            options = [line.split()[0] for line in lines if line.startswith("  ") and not line.startswith("   ")]
            # one short flag, everywhere the same: `-v, --verbose` (the trace on the console)
            assert all(o.startswith("--") and not o.startswith("--=") for o in options if o not in ("none", "-v,")), \
                (name, options)
            assert "-v," not in options or any(line.split()[:2] == ["-v,", "--verbose"] for line in lines), name
    finally:
        for name, kept in helps.items():
            tasks.ns[name].help.update(kept)
    assert "the run of this inventory that is running" in inv("stop", "--help").stdout


def test_the_readmes_tasks_py_lines_work_in_a_file_of_plain_tasks(tmp_path: Path) -> None:
    """`namespace.add_collection(ns, "ddp")`, as the README had it, failed pasted into a tasks.py of plain @tasks
    (NameError: namespace); the README's lines are run here as a project's own tasks.py."""
    readme = (REPO / "docs" / "usage.md").read_text()  # the README points there
    blocks = [b.split("```", 1)[0] for b in readme.split("```python\n")[1:]]
    (block,) = [b for b in blocks if "add_collection(ddp" in b]
    (tmp_path / "tasks.py").write_text(block)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("INVOKE_")}, "PYTHONPATH": str(REPO)}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=60, check=False)

    listed = run("--list")
    assert listed.returncode == 0, listed.stderr
    names = {line.split()[0] for line in listed.stdout.splitlines()[1:] if line.strip()}
    assert {"lint", "ddp.launch", "ddp.doctor", "ddp.init", "ddp.slurm.submit"} <= names, listed.stdout
    missing = run("ddp.doctor", "--hosts", "nope.yaml")  # a task of the launcher's, with its settings' defaults
    assert missing.returncode == 1 and "nope.yaml: no such file" in missing.stderr, missing.stderr


def test_the_readme_installs_from_what_exists_and_says_what_an_unknown_option_exits_with() -> None:
    """`pip install ddp-launcher` failed (no release on PyPI yet); the README said an unknown option exits 2."""
    readme = (REPO / "README.md").read_text()
    assert "pip install ddp-launcher" not in readme
    assert "pip install ./ddp-launcher" in readme and 'pip install "git+URL"' in readme
    for argv in (["launcher", "--nope"], ["invoke", "--nope"], ["launcher", "launch", "--nope"]):
        done = subprocess.run([sys.executable, "-m", *argv], cwd=REPO, capture_output=True, text=True, timeout=60,
                              env={**os.environ, "PYTHONPATH": str(REPO)}, check=False)
        assert (done.returncode, done.stderr.strip()) == (1, "No idea what '--nope' is!"), argv
    said = " ".join(readme.split())
    assert "an option the task does not have exits 1 (Invoke's own `No idea what '--nope' is!`" in said
