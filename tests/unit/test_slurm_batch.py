"""`inv slurm.submit`'s batch script (rendered, checked, run by a real bash without SLURM) and reading SLURM's text."""

from __future__ import annotations

import io
import os
import shlex
import signal
import subprocess
import time
from pathlib import Path

import pytest

from launcher import paths
from launcher.app import slurm as on_slurm
from launcher.app.job import JobArgs
from launcher.errors import USAGE, LauncherError
from launcher.run.run_io import RunIO
from launcher.settings import Settings
from launcher.slurm import jobs
from launcher.slurm.batch import BatchSpec, check_job_id, check_time, launch_command, render_batch_script

PYTHON = "/opt/venv/bin/python"


def spec(**changes: object) -> BatchSpec:
    values: dict[str, object] = {"nodes": 2, "log_dir": "/work/logs/slurm", "workdir": "/work",
                                 "command": launch_command(PYTHON, "hosts/cluster.yaml")}
    values.update(changes)
    return BatchSpec(**values)  # type: ignore[arg-type]


def directives(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("#SBATCH")]


def usage(excinfo: pytest.ExceptionInfo[LauncherError]) -> str:
    assert excinfo.value.exit_code == USAGE
    return str(excinfo.value)


# ---- the script ---------------------------------------------------------------------------------------------------

def test_minimal_script_asks_only_for_what_was_given():
    text = render_batch_script(spec())
    assert text.startswith("#!/bin/bash\n")
    assert directives(text) == [
        "#SBATCH --job-name=ddp",
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --output=/work/logs/slurm/slurm-%j.out",
        "#SBATCH --error=/work/logs/slurm/slurm-%j.out",
        "#SBATCH --chdir=/work",
    ]
    assert f"{PYTHON} -m invoke launch --slurm --hosts=hosts/cluster.yaml\n" in text
    assert "doctor" in text.split("#SBATCH --chdir=/work\n")[1].splitlines()[0]  # says why no doctor step


def test_partition_time_and_gpus_when_given():
    text = render_batch_script(spec(partition="gpu,debug", time="1-12:00", gpus_per_node="a100:4", job_name="bert",
                                    nodes=8))
    assert directives(text) == [
        "#SBATCH --job-name=bert",
        "#SBATCH --nodes=8",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --output=/work/logs/slurm/slurm-%j.out",
        "#SBATCH --error=/work/logs/slurm/slurm-%j.out",
        "#SBATCH --partition=gpu,debug",
        "#SBATCH --time=1-12:00",
        "#SBATCH --gpus-per-node=a100:4",
        "#SBATCH --chdir=/work",
    ]


def test_launch_words_pass_the_inner_launch_options():
    argv = launch_command(PYTHON, "hosts/a b.yaml", script="train/x.py", args="--epochs 2 --name 'a b'",
                           skip_doctor=True)
    assert argv == (PYTHON, "-m", "invoke", "launch", "--slurm", "--hosts=hosts/a b.yaml", "--script=train/x.py",
                     "--args=--epochs 2 --name 'a b'", "--skip-doctor")


NASTY = ["$(touch pwned)", "`id`", "a; rm -rf /", "it's", 'say "hi"', "$HOME", "*", "line\ntwo", "ünï ✓", ""]


def run_script(text: str, tmp_path: Path, job_id: str = "41") -> subprocess.Popen[str]:
    script = tmp_path / "job.sh"
    script.write_text(text, encoding="utf-8")
    env = {**os.environ, "SLURM_JOB_ID": job_id, "SLURM_JOB_NODELIST": "node-[0-1]"}
    return subprocess.Popen(["bash", str(script)], cwd=tmp_path, env=env, stdout=subprocess.PIPE, text=True,
                            start_new_session=True)


def test_every_word_reaches_the_command_as_it_is(tmp_path: Path):
    """A real bash runs the script: each word arrives whole, nothing is expanded, the job's end is recorded."""
    text = render_batch_script(spec(log_dir=str(tmp_path), workdir=str(tmp_path),
                                    command=("printf", "[%s]\\n", *NASTY)))
    proc = run_script(text, tmp_path)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0
    assert out == "".join(f"[{word}]\n" for word in NASTY)
    assert not (tmp_path / "pwned").exists()
    state = jobs.state_from_fields("41", jobs.parse_fields((tmp_path / "slurm-41.end").read_text()), "record", None)
    assert (state.state, state.exit_code, state.signal, state.nodes) == ("COMPLETED", 0, None, "node-[0-1]")


def test_a_failed_launch_keeps_its_exit_code_and_is_recorded(tmp_path: Path):
    text = render_batch_script(spec(log_dir=str(tmp_path), workdir=str(tmp_path), command=("sh", "-c", "exit 3")))
    proc = run_script(text, tmp_path, job_id="42")
    proc.communicate(timeout=30)
    assert proc.returncode == 3
    line = (tmp_path / "slurm-42.end").read_text()
    assert jobs.state_from_fields("42", jobs.parse_fields(line), "record", None).exit_code == 3
    assert "JobState=FAILED ExitCode=3:0" in line


def test_term_as_scancel_sends_it_ends_the_launch_and_records_cancelled(tmp_path: Path):
    """scancel signals every process of the batch step: the launch ends first, then bash's trap records it."""
    text = render_batch_script(spec(log_dir=str(tmp_path), workdir=str(tmp_path),
                                    command=("sh", "-c", "echo started; exec sleep 30")))
    proc = run_script(text, tmp_path, job_id="43")
    assert proc.stdout is not None and proc.stdout.readline() == "started\n"
    os.killpg(proc.pid, signal.SIGTERM)
    started = time.monotonic()
    proc.wait(timeout=10)
    assert time.monotonic() - started < 5
    assert proc.returncode == 143
    assert "JobState=CANCELLED ExitCode=0:15" in (tmp_path / "slurm-43.end").read_text()


# ---- options checked before anything is written or submitted --------------------------------------------------

@pytest.mark.parametrize("nodes", [0, -1, True, "2", 1.5])
def test_nodes_must_be_a_positive_whole_number(nodes: object):
    with pytest.raises(LauncherError) as excinfo:
        render_batch_script(spec(nodes=nodes))
    assert usage(excinfo).startswith("--nodes must be a whole number of at least 1")


@pytest.mark.parametrize("value", ["30", "90", "0", "5:30", "2:00:00", "48:00:00", "1-12", "1-12:30", "7-00:00:00",
                                   "UNLIMITED", "infinite"])
def test_slurm_time_forms(value: str):
    assert check_time(value) == value


@pytest.mark.parametrize("value", ["", "1h", "90m", "1:2:3:4", "1-", "-5", "1-12:60", "10:75", "1.5", "1 -12",
                                   "2:00:00; rm -rf /"])
def test_other_times_are_refused_naming_the_option(value: str):
    with pytest.raises(LauncherError) as excinfo:
        check_time(value)
    assert usage(excinfo).startswith("--time must be SLURM's MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS")


@pytest.mark.parametrize(("field", "value", "option"), [
    ("partition", "gpu a100", "--partition"),
    ("partition", "gpu,", "--partition"),
    ("partition", "$(id)", "--partition"),
    ("partition", "", "--partition"),
    ("gpus_per_node", "0", "--gpus-per-node"),
    ("gpus_per_node", "a100:", "--gpus-per-node"),
    ("gpus_per_node", "two", "--gpus-per-node"),
    ("job_name", "my job", "--job-name"),
    ("job_name", "", "--job-name"),
    ("time", "soon", "--time"),
])
def test_each_bad_option_is_named(field: str, value: str, option: str):
    with pytest.raises(LauncherError) as excinfo:
        render_batch_script(spec(**{field: value}))
    assert usage(excinfo).startswith(f"{option} must be")
    assert repr(value) in str(excinfo.value)


@pytest.mark.parametrize("path", ["logs/slurm", "/work/my logs", "/work/100%", "/work/'x'", "/work/#1"])
def test_paths_an_sbatch_line_cannot_carry_are_refused(path: str):
    with pytest.raises(LauncherError) as excinfo:
        render_batch_script(spec(log_dir=path))
    assert "the batch script's log dir" in usage(excinfo)


def test_a_command_is_needed():
    with pytest.raises(LauncherError) as excinfo:
        render_batch_script(spec(command=()))
    assert usage(excinfo) == "the batch script needs a command to run"


@pytest.mark.parametrize("job_id", ["1", "123", " 4567 ", "123_4"])
def test_job_ids(job_id: str):
    assert check_job_id(job_id) == job_id.strip()


@pytest.mark.parametrize("job_id", ["", "abc", "0", "12a", "-1", "123_", "_4", "123_4_5", "1;scancel -u root",
                                    "$(id)", "1 2"])
def test_other_job_ids_are_refused(job_id: str):
    with pytest.raises(LauncherError) as excinfo:
        check_job_id(job_id)
    assert usage(excinfo).startswith("--job must be a SLURM job id such as 123 or 123_4")


def test_job_state_checks_the_id_before_asking_slurm():
    with pytest.raises(LauncherError) as excinfo:
        jobs.job_state("1; scancel -u root")
    assert excinfo.value.exit_code == USAGE


# ---- SLURM's text ---------------------------------------------------------------------------------------------

SCONTROL = ("JobId=3 JobName=try a UserId=root(0) GroupId=root(0) JobState=COMPLETED Reason=None "
            "Dependency=(null) Requeue=1 ExitCode=2:0 RunTime=00:00:30 NodeList=node-[0-1] BatchHost=node-0 "
            "AllocNode:Sid=localhost:29156 ReqB:S:C:T=0:0:*:* TRES=cpu=2,mem=2M,node=2 Socks/Node=* "
            "Command=/tmp/my dir/a.sh WorkDir=/tmp/my dir StdErr=/tmp/my dir/slurm-3.out StdIn=/dev/null "
            "StdOut=/tmp/my dir/slurm-3.out Power= ")


def test_scontrol_line_fields_keep_values_with_spaces():
    fields = jobs.parse_fields(SCONTROL)
    assert fields["JobName"] == "try a"
    assert fields["StdOut"] == "/tmp/my dir/slurm-3.out"
    assert fields["TRES"] == "cpu=2,mem=2M,node=2"
    assert fields["AllocNode:Sid"] == "localhost:29156"
    assert fields["Power"] == ""


def test_state_from_scontrol():
    state = jobs.state_from_fields("3", jobs.parse_fields(SCONTROL), "scontrol", Path("fallback.out"))
    assert state == jobs.JobState("3", "COMPLETED", 2, None, "node-[0-1]", "", Path("/tmp/my dir/slurm-3.out"),
                                  "scontrol")
    assert state.ended and state.known


def test_a_running_job_has_no_exit_code_yet():
    fields = jobs.parse_fields("JobId=9 JobState=RUNNING Reason=None ExitCode=0:0 NodeList=node-0 StdOut=")
    state = jobs.state_from_fields("9", fields, "scontrol", Path("logs/slurm/slurm-9.out"))
    assert (state.state, state.exit_code, state.output, state.ended) == ("RUNNING", None,
                                                                         Path("logs/slurm/slurm-9.out"), False)


def test_a_pending_job_says_why():
    fields = jobs.parse_fields("JobId=8 JobState=PENDING Reason=PartitionConfig ExitCode=0:0 NodeList= StdOut=/x")
    state = jobs.state_from_fields("8", fields, "scontrol", None)
    assert (state.state, state.reason, state.nodes, state.ended) == ("PENDING", "PartitionConfig", "", False)


@pytest.mark.parametrize(("text", "expected"), [("0:0", (0, None)), ("3:0", (3, None)), ("0:15", (0, 15)),
                                                ("143:0", (143, None)), ("", (None, None)), ("n/a", (None, None))])
def test_exit_codes(text: str, expected: tuple[int | None, int | None]):
    assert jobs.parse_exit(text) == expected


def test_sacct_line():
    text = "12|CANCELLED by 0|0:15|node-[0-1]|None\n12.batch|CANCELLED|0:15|node-0|\n"
    state = jobs.parse_sacct("12", text, Path("o"))
    assert state == jobs.JobState("12", "CANCELLED", 0, 15, "node-[0-1]", "", Path("o"), "sacct")
    assert jobs.parse_sacct("13", text, None) is None


# ---- the task's front: what submit would do, without SLURM --------------------------------------------------------

def test_submit_dry_run_prints_the_script_and_submits_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    inventory = tmp_path / "cluster.yaml"
    inventory.write_text("hosts: [{name: node-0}]\n")
    monkeypatch.chdir(tmp_path)
    out = io.StringIO()
    code = on_slurm.slurm_submit(str(inventory), 2, time="30", dry_run=True, job=JobArgs(args="--epochs 1"),
                                 settings=Settings.of(log_dir=Path("logs")), run_io=RunIO(out=out))
    assert code == 0
    text = out.getvalue()
    assert f"#SBATCH --output={tmp_path}/logs/slurm/slurm-%j.out" in directives(text)
    assert f"#SBATCH --chdir={paths.REPO}" in directives(text)
    command = next(line for line in text.splitlines() if "-m invoke launch" in line)
    assert shlex.split(command)[-2:] == [f"--hosts={inventory}", "--args=--epochs 1"]
    assert not (tmp_path / "logs").exists()


def test_the_installed_commands_job_starts_in_the_project_and_runs_python_m_launcher(tmp_path: Path,
                                                                                     monkeypatch: pytest.MonkeyPatch):
    """`ddpl slurm.submit` in a project: the job starts at the project's root, runs `python -m launcher` (which
    reads the project's ddpl.yaml there) on the inventory relative to it, with the job's form (--module)."""
    (tmp_path / "hosts").mkdir()
    inventory = tmp_path / "hosts" / "cluster.yaml"
    inventory.write_text("hosts: [{name: node-0}]\n")
    monkeypatch.chdir(tmp_path)
    out = io.StringIO()
    code = on_slurm.slurm_submit(str(inventory), 2, dry_run=True, job=JobArgs(module="pkg.train"), project=tmp_path,
                                 settings=Settings.of(log_dir=Path("logs")), run_io=RunIO(out=out))
    assert code == 0
    assert f"#SBATCH --chdir={tmp_path}" in directives(out.getvalue())
    command = next(line for line in out.getvalue().splitlines() if "-m launcher launch" in line)
    assert shlex.split(command)[-3:] == ["--slurm", "--hosts=hosts/cluster.yaml", "--module=pkg.train"]


def test_submit_refuses_a_missing_inventory(tmp_path: Path):
    with pytest.raises(LauncherError) as excinfo:
        on_slurm.slurm_submit(str(tmp_path / "nope.yaml"), 2, dry_run=True, settings=Settings(), run_io=RunIO())
    assert usage(excinfo).startswith("--hosts: no inventory or hostfile at")


# ---- what the job's files let others read (a real slurmctld) ------------------------------------------------------


