"""The installed command in a user's project: its root (git's top, else the current folder), the settings' levels
(~/.ddpl.yaml, the project's ddpl.yaml, DDPL_ variables, -f) and where each came from, relative paths that are the
project's, never a project file another user owns, and the launcher's tasks inside a project's own tasks.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from invoke import Context

from launcher import app, taskkit, tasks
from launcher.app.hosts import with_project_src
from launcher.cliconfig import DdplConfig, sources
from launcher.config.model import Cluster
from launcher.errors import UnsafeProject
from launcher.project import check_owner, find_root
from tests.helpers import REPO

INVENTORY = "hosts: [a, b]\ndefaults: {workdir: /w}\njob: {script: train.py}\n"
NOBODY = 65534


def ddpl(cwd: Path, *args: str, home: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`ddpl ARGS` in `cwd` as a user runs it (`python -m launcher`: this checkout's package first)."""
    mine = {k: v for k, v in os.environ.items() if not k.startswith(("DDPL_", "INVOKE_"))}
    full = {**mine, "HOME": str(home), "PYTHONPATH": str(REPO), **(env or {})}
    return subprocess.run([sys.executable, "-m", "launcher", *args], cwd=cwd, env=full, capture_output=True,
                          text=True, timeout=60, check=False)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A git project with an inventory and a ddpl.yaml, and a home of its own beside it."""
    root = tmp_path / "proj"
    (root / "hosts").mkdir(parents=True)
    (root / "src" / "deep").mkdir(parents=True)
    (root / ".git").mkdir()  # what find_root looks for; no git process is needed
    (root / "hosts" / "c.yaml").write_text(INVENTORY)
    (root / "ddpl.yaml").write_text("hosts: hosts/c.yaml\ngrace: 5\nlog_dir: runs\n")
    (tmp_path / "home").mkdir()
    return root


def test_the_root_is_gits_top_else_the_folder_itself(tmp_path: Path) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    assert find_root(tmp_path / "a" / "b") == tmp_path / "a" / "b"
    (tmp_path / "a" / ".git").write_text("gitdir: /elsewhere\n")  # a worktree's or submodule's .git is a file
    assert find_root(tmp_path / "a" / "b") == tmp_path / "a"


def test_from_a_subfolder_the_projects_settings_and_paths_are_used(project: Path) -> None:
    home = project.parent / "home"
    shown = ddpl(project / "src" / "deep", "launch", "--dry-run", home=home, env={"DDPL_SILENCE_TIMEOUT": "7"})
    assert shown.returncode == 0, shown.stderr
    assert "train.py" in shown.stdout
    heading = "settings the run uses that are not their defaults, and where each came from:\n"
    lines = shown.stdout.split(heading)[1].splitlines()
    assert [line.split()[:2] for line in lines] == [["hosts", f"{project}/hosts/c.yaml"], ["grace", "5"],
                                                    ["silence_timeout", "7"], ["log_dir", f"{project}/runs"]]
    assert lines[1].endswith(f"  {project}/ddpl.yaml") and lines[2].endswith("  DDPL_SILENCE_TIMEOUT")


def test_config_sources_names_every_level(project: Path) -> None:
    home = project.parent / "home"
    (home / ".ddpl.yaml").write_text("grace: 7\nconnect_timeout: 3\n")
    runtime = project.parent / "run.yaml"
    runtime.write_text("probe_timeout: 9\n")
    shown = ddpl(project / "src", "-f", str(runtime), "--config-sources", home=home, env={"DDPL_RETRY_WAIT": "1"})
    assert shown.returncode == 0, shown.stderr
    out = shown.stdout
    assert f"user config: {home}/.ddpl.yaml" in out and f"project config: {project}/ddpl.yaml" in out
    assert f"project root: {project} " in out
    said = {line.split()[0]: line.rsplit(" from ", 1)[1] for line in out.splitlines() if " from " in line}
    assert said["grace"] == f"{project}/ddpl.yaml"  # the project's file wins over the user's
    assert said["connect_timeout"] == f"{home}/.ddpl.yaml"
    assert said["retry_wait"] == "DDPL_RETRY_WAIT" and said["probe_timeout"] == str(runtime)
    assert said["straggler_hold"] == "default"


@pytest.mark.parametrize(("text", "message"), [
    ("grace: soon\n", "ddpl.yaml: grace must be a number of seconds, got 'soon'"),
    ("gracee: 1\n", "ddpl.yaml: gracee: unknown key; known keys: hosts, log_dir, grace"),
    ("- grace\n", "ddpl.yaml: must be a mapping of settings"),
    ("grace: [\n", "ddpl.yaml: not YAML"),
])
def test_a_wrong_setting_names_its_file(project: Path, text: str, message: str) -> None:
    (project / "ddpl.yaml").write_text(text)
    shown = ddpl(project, "status", home=project.parent / "home")
    assert shown.returncode in (1, 2) and f"error: {project}/{message}" in shown.stderr, shown.stderr
    assert "Traceback" not in shown.stderr


def test_a_ddpl_py_is_the_projects_code_never_run_as_settings(project: Path) -> None:
    (project / "ddpl.yaml").unlink()
    (project / "ddpl.py").write_text("raise SystemExit('ran')\n")
    shown = ddpl(project, "--config-sources", home=project.parent / "home")
    assert shown.returncode == 0 and "ran" not in shown.stderr and "project config: " in shown.stdout


@pytest.mark.skipif(os.geteuid() != 0, reason="making a file another user's needs root")
def test_a_project_file_another_user_owns_is_never_read(project: Path) -> None:
    home = project.parent / "home"
    os.chown(project / "ddpl.yaml", NOBODY, -1)
    shown = ddpl(project / "src", "launch", "--dry-run", home=home)
    assert shown.returncode == 1
    assert shown.stderr.startswith(f"error: {project}/ddpl.yaml belongs to ") and "(uid 65534), not to you" in \
        shown.stderr and f"safe_directories: [{project}]" in shown.stderr, shown.stderr
    (home / ".ddpl.yaml").write_text(f"safe_directories: [{project}]\n")  # the user trusts that folder
    assert ddpl(project / "src", "launch", "--dry-run", home=home).returncode == 0
    (home / ".ddpl.yaml").unlink()
    os.chown(project / "ddpl.yaml", 0, -1)
    os.chown(project, NOBODY, -1)  # a folder another user owns: its file is not read either
    assert f"error: {project} belongs to " in ddpl(project, "status", home=home).stderr
    os.chown(project, 0, -1)
    (project / "ddpl.yaml").write_text("grace: 5\n")  # the inventory the settings find is the project's too
    os.chown(project / "hosts" / "c.yaml", NOBODY, -1)
    assert "hosts/cluster.yaml: no such file" in ddpl(project, "status", home=home).stderr
    (project / "ddpl.yaml").write_text("hosts: hosts/c.yaml\n")
    assert "hosts/c.yaml belongs to " in ddpl(project, "status", home=home).stderr


def test_check_owner_passes_this_users_files_and_trusted_folders(tmp_path: Path) -> None:
    mine = tmp_path / "ddpl.yaml"
    mine.write_text("")
    check_owner(mine)
    check_owner(tmp_path / "absent.yaml")  # nothing there: nothing to read
    if os.geteuid() == 0:
        os.chown(mine, NOBODY, -1)
        with pytest.raises(UnsafeProject):
            check_owner(mine)
        check_owner(mine, [str(tmp_path)])
        check_owner(mine, ["*"])


def context(root: Path) -> Context:
    """The task's context as `ddpl` makes it in `root` (settings loaded, collection defaults, no variables)."""
    config = DdplConfig(lazy=True, project_location=str(root))
    config.load_base_conf_files()
    config.load_project()
    config.load_collection(tasks.ns.configuration())
    config.merge()
    return Context(config)


def test_relative_paths_in_settings_are_the_projects(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(project / "src" / "deep")
    monkeypatch.setenv("HOME", str(project.parent / "home"))
    c = context(project)
    assert sources(c.config)["log_dir"] == f"{project}/ddpl.yaml"
    assert taskkit.task_settings(c).output.log_dir == project / "runs"
    hosts = taskkit.task_hosts(c, None)
    assert Path(hosts.path).resolve() == project / "hosts" / "c.yaml" and hosts.project == project
    assert taskkit.task_hosts(c, "mine.yaml").path == "mine.yaml"  # the command line's path: from where it is typed
    cluster = app.load_inventory(hosts)
    assert with_project_src(cluster, hosts).sync.src == str(project / ".")  # sync sends the project's tree
    moved = Cluster(cluster.source, cluster.hosts, cluster.rendezvous, cluster.job,
                    sync=type(with_project_src(cluster, hosts).sync)(src="code"))
    assert with_project_src(moved, hosts).sync.src == str(project / "code")
    assert with_project_src(cluster, "hosts/c.yaml").sync is None  # a checkout's inv: the current folder


def test_a_projects_own_tasks_py_adds_the_launchers_tasks(tmp_path: Path) -> None:
    (tmp_path / "hosts").mkdir()
    (tmp_path / "hosts" / "c.yaml").write_text(INVENTORY)
    (tmp_path / "tasks.py").write_text(
        "from invoke import Collection, task\nfrom launcher.tasks import ns as ddp\n\n\n@task\ndef hello(c):\n"
        "    print('hello')\n\n\nns = Collection(hello)\nns.add_collection(ddp, 'ddp')\n")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    listed = subprocess.run([sys.executable, "-m", "invoke", "--list"], cwd=tmp_path, env=env, capture_output=True,
                            text=True, timeout=60)
    assert "ddp.launch" in listed.stdout and "hello" in listed.stdout, listed.stderr
    shown = subprocess.run([sys.executable, "-m", "invoke", "ddp.launch", "--hosts", "hosts/c.yaml", "--dry-run"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0 and "train.py" in shown.stdout, shown.stderr
