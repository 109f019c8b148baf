"""What a node program reads of the installed packages, under `python -S` as every node program runs: site's folders
as site itself would put them on sys.path, without running anything a .pth file or sitecustomize would run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.helpers import REPO

READ = f"""
import json, sys
sys.path.insert(0, {str(REPO)!r})
from launcher.node.probe import facts
facts.with_site()
print(json.dumps({{"path": sys.path, "torch": facts.torch_info()}}))
"""


def test_site_folders_without_their_hooks(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site_packages = next(venv.glob("lib/python3*/site-packages"))
    extra = tmp_path / "extra"
    (extra / "torch-9.9.9.dist-info").mkdir(parents=True)  # torch found only through the .pth's folder line
    marker = tmp_path / "hook-ran"
    (site_packages / "extra.pth").write_text(f"# a comment\n{extra}\n{tmp_path / 'missing'}\n")
    (site_packages / "hook.pth").write_text(f"import pathlib; pathlib.Path({str(marker)!r}).touch()\n")
    python = str(venv / "bin" / "python")

    found = json.loads(subprocess.run([python, "-S", "-c", READ], capture_output=True, text=True, check=True,
                                      cwd=tmp_path).stdout)
    assert found["torch"]["version"] == "9.9.9"
    assert not marker.exists()  # an editable install's finder, a hook: not run by what only reads metadata
    with_site = subprocess.run([python, "-c", "import json, sys; print(json.dumps(sys.path))"],
                               capture_output=True, text=True, check=True, cwd=tmp_path)
    assert marker.exists()  # (site itself runs it)
    here = {"", str(REPO), str(tmp_path)}  # the command's own folder, as each run names it
    assert [p for p in found["path"] if p not in here] == [p for p in json.loads(with_site.stdout) if p not in here]
