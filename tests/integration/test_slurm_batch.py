"""`inv slurm.submit`'s batch script (rendered, checked, run by a real bash without SLURM) and reading SLURM's text."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

# ---- the script ---------------------------------------------------------------------------------------------------


# ---- options checked before anything is written or submitted --------------------------------------------------


# ---- SLURM's text ---------------------------------------------------------------------------------------------


# ---- the task's front: what submit would do, without SLURM --------------------------------------------------------


# ---- what the job's files let others read (a real slurmctld) ------------------------------------------------------


@pytest.mark.integration
def test_job_output_is_0600_in_a_0700_folder_and_the_job_keeps_the_users_umask(make_sandbox, tmp_path: Path):
    from devtools.sandbox import slurm_env
    from tests.conftest import free_port
    from tests.helpers import inv, wait_for

    box = make_sandbox(1, master_port=free_port(), slurm=True)
    logs = tmp_path / "logs"
    folder = logs / "slurm"
    folder.mkdir(parents=True, mode=0o755)  # as an older version left it
    folder.chmod(0o755)
    env = {**slurm_env(box.state_dir), "INVOKE_LAUNCHER_LOG_DIR": str(logs)}
    submitted = inv("slurm.submit", "--hosts", str(box.inventory), "--nodes", "1", "--script",
                    "tests/scripts/exit_on_node.py", "--args", "0 0", env=env, umask=0o022, timeout=120)
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    job = submitted.stdout.split("submitted batch job ")[1].split()[0]
    end = folder / f"slurm-{job}.end"
    wait_for(end.exists, 150, f"job {job} ended")
    output = folder / f"slurm-{job}.out"
    assert "all 1 node(s) exited 0" in output.read_text(), output.read_text()
    modes = {path.name: oct(path.stat().st_mode & 0o777) for path in (folder, output, folder / f"slurm-{job}.sh")}
    assert modes == {"slurm": "0o700", f"slurm-{job}.out": "0o600", f"slurm-{job}.sh": "0o600"}
    assert oct(end.stat().st_mode & 0o777) == "0o644"  # written by the job itself: the submitter's umask


@pytest.fixture
def tmpfs(tmp_path: Path):
    """Mount a 64 KiB tmpfs at tmp_path/mnt with these options (as root); unmounted at teardown."""
    mounted: list[Path] = []

    def mount(options: str) -> Path:
        point = tmp_path / f"mnt{len(mounted)}"
        point.mkdir()
        if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size=64k,{options}", "tmpfs", str(point)],
                          capture_output=True).returncode != 0:
            pytest.skip("cannot mount a tmpfs here (needs root)")
        mounted.append(point)
        return point

    yield mount
    for point in mounted:
        subprocess.run(["umount", str(point)], check=False)


def test_an_unusable_slurm_log_folder_is_one_sentence(tmp_path: Path, tmpfs) -> None:
    from tests.helpers import inv

    (tmp_path / "a-file").write_text("")
    full = tmpfs("rw")
    (full / "slurm").mkdir()
    with open(full / "filler", "wb", buffering=0) as filler, pytest.raises(OSError):  # until the disk is full
        while True:
            filler.write(b"\0" * 4096)
    read_only = tmpfs("ro")
    expected = {
        tmp_path / "a-file": f"error: cannot use {tmp_path}/a-file/slurm for SLURM job files: Not a directory; make "
                             "it writable, or set launcher.log_dir in invoke.yaml",
        read_only: f"error: cannot use {read_only}/slurm for SLURM job files: Read-only file system; make it "
                   "writable, or set launcher.log_dir in invoke.yaml",
        full: f"error: cannot write the batch script {full}/slurm/submit-*.sh: No space left on device; free some "
              "space or make the folder writable (or set launcher.log_dir in invoke.yaml)",
    }
    for log_dir, sentence in expected.items():
        result = inv("slurm.submit", "--hosts", "hosts/example.yaml", "--nodes", "1",
                     env={"INVOKE_LAUNCHER_LOG_DIR": str(log_dir)}, timeout=60)
        assert (result.returncode, result.stdout) == (1, ""), result.stderr
        stem, _, rest = sentence.partition("submit-*.sh")
        lines = result.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith(stem) and lines[0].endswith(rest), result.stderr
    assert list((full / "slurm").iterdir()) == []  # no half-written script left
