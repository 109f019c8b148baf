"""The README's two set-up commands as a fresh Debian or Ubuntu machine runs them.

There `python3` is the distribution's, marked externally managed (PEP 668), so `pip install` into it is refused;
`scripts/setup` makes a venv with it instead. This machine's own PATH puts a pyenv Python first, which hides that:
the test runs the script with the PATH of a fresh machine (`/usr/bin/python3` first) on a copy of the checkout,
keeping only pip's own settings (where this machine finds its torch wheel) from the environment.

Where the suite itself runs in a venv that scripts/setup made with the distribution's python3 from these very files
(`.ci/run` on a fresh machine: the README's command), that was the first run; the copy takes that venv (a link)
rather than making a second one of 2 GB, and the test goes on from the second run.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from devtools.sandbox.procs import pids_mentioning
from tests.helpers import REPO, wait_for

SYSTEM_PYTHON = Path("/usr/bin/python3")
FRESH_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"


def _externally_managed() -> bool:
    stdlib = subprocess.run([SYSTEM_PYTHON, "-c", "import sysconfig; print(sysconfig.get_path('stdlib'))"],
                            capture_output=True, text=True, check=True).stdout.strip()
    return (Path(stdlib) / "EXTERNALLY-MANAGED").exists()


def _copy_checkout(dest: Path) -> None:
    """The checkout's tracked files as they are now (a fresh clone, with this work tree's edits)."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    for name in filter(None, listed.decode().split("\0")):
        source = REPO / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)


def _venv_the_readme_made() -> Path | None:
    """This suite's own venv where scripts/setup made it with the distribution's python3 from the files as they are
    now (its stamp), else None."""
    venv = REPO / ".venv"
    if Path(sys.prefix) != venv:
        return None
    settings = dict(line.split(" = ", 1) for line in (venv / "pyvenv.cfg").read_text().splitlines() if " = " in line)
    made_from = hashlib.sha256((REPO / "pyproject.toml").read_bytes() + (REPO / "scripts/setup").read_bytes())
    stamp = venv / ".made-from"
    stamped = stamp.exists() and stamp.read_text().split(" ")[0].strip() == made_from.hexdigest()
    return venv if settings.get("home") == str(SYSTEM_PYTHON.parent) and stamped else None


def _fresh_env(home: Path) -> dict[str, str]:
    env = {"PATH": FRESH_PATH, "HOME": str(home), "LANG": "C.UTF-8"}
    env.update({k: v for k, v in os.environ.items() if k.startswith("PIP_")})  # pip's settings: its wheel source
    # pip byte-compiles the ~12,000 files it installs (20 of its 45 CPU-seconds here); what the test runs compiles
    # and caches the few hundred modules it imports. "0" is pip's spelling of --no-compile in the environment (its
    # store_false options read the value as the option's own: "1" keeps compiling).
    env["PIP_NO_COMPILE"] = "0"
    return env


@pytest.mark.integration
@pytest.mark.skipif(not SYSTEM_PYTHON.exists() or sys.platform != "linux", reason="needs a distribution's python3")
@pytest.mark.skipif(os.geteuid() != 0, reason="scripts/setup installs Debian packages as root")
def test_the_readme_set_up_commands_work_with_the_distributions_own_python3(tmp_path: Path) -> None:
    checkout, home = tmp_path / "checkout", tmp_path / "home"
    home.mkdir()
    _copy_checkout(checkout)
    env = _fresh_env(home)
    if _externally_managed():  # as on a fresh Debian 12 / Ubuntu 24.04: what the old set-up ran into
        refused = subprocess.run([SYSTEM_PYTHON, "-m", "pip", "install", "--dry-run", "pyyaml"], env=env,
                                 capture_output=True, text=True, timeout=120)
        assert refused.returncode != 0 and "externally-managed-environment" in refused.stderr, refused.stderr

    made = _venv_the_readme_made()
    if made is not None:
        (checkout / ".venv").symlink_to(made)
    else:
        setup = subprocess.run(["scripts/setup"], cwd=checkout, env=env, capture_output=True, text=True, timeout=900)
        assert setup.returncode == 0, setup.stdout + setup.stderr[-4000:]
    venv_python = checkout / ".venv" / "bin" / "python"
    base = subprocess.run([venv_python, "-c", "import sys, torch, launcher; print(sys.base_prefix, torch.__version__)"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert base.returncode == 0, base.stderr
    system_prefix = subprocess.run([SYSTEM_PYTHON, "-c", "import sys; print(sys.base_prefix)"], capture_output=True,
                                   text=True, check=True).stdout.strip()
    prefix, torch_version = base.stdout.split()
    assert prefix == system_prefix and torch_version.startswith("2.13.0"), base.stdout

    # Run again: nothing to do, still rc 0 (the README runs it before each of its two commands).
    again = subprocess.run(["scripts/setup"], cwd=checkout, env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-4000:]

    # The test command's runner and the demo's `inv`, from the venv the script made.
    tests = subprocess.run([venv_python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/unit/test_options.py"],
                           cwd=checkout, env=env, capture_output=True, text=True, timeout=300)
    assert tests.returncode == 0 and " passed" in tests.stdout, tests.stdout[-3000:] + tests.stderr[-2000:]
    demo = subprocess.run([checkout / ".venv" / "bin" / "inv", "demo"], cwd=checkout, env=env, capture_output=True,
                          text=True, timeout=600)
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    checksums = {line.rsplit("sha256=", 1)[1] for line in demo.stdout.splitlines() if "CHECKSUM rank=" in line}
    assert len(checksums) == 1 and demo.stdout.count("CHECKSUM rank=") == 4, demo.stdout[-3000:]
    assert "all 2 node(s) exited 0" in demo.stderr + demo.stdout
    # the run's page, written before the demo's nodes go down (a user's environment: pages on)
    page = re.search(r"the run's page: (logs/\S+/report\.html)", demo.stdout)
    assert page and "first optimizer step on every rank" in (checkout / page.group(1)).read_text(), demo.stdout[-2000:]
    wait_for(lambda: pids_mentioning(str(checkout)) == [], 30, "the demo's nodes and run gone")
    if made is None:
        shutil.rmtree(checkout / ".venv")  # 2 GB (torch, transformers): pytest keeps the last three runs' folders
