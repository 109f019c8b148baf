"""Stand-ins for a GPU node on a machine without one: an nvidia-smi on PATH that answers in its real formats
(tests/support/smi_standin.py), and a torch whose files say which CUDA it was built for.

Sandbox nodes share one filesystem: each node gets a PATH folder of its own (`install_smi` into `folder`, then the
inventory's `setup: export PATH=FOLDER:$PATH`), so node-1 can show 8 idle GPUs while node-2's driver hangs.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

STANDIN = Path(__file__).with_name("smi_standin.py")
H100 = "NVIDIA H100 80GB HBM3"


def gpu(index: int, *, name: str = H100, used: int | str = 0, util: int | str = 0, driver: str = "550.54.15",
        mig: str = "Disabled", total: int = 81559, error: str | None = None) -> dict[str, Any]:
    """One GPU as the stand-in lists it (memory in MiB, utilisation in %; a string such as "[N/A]" as it is)."""
    return {"index": index, "uuid": f"GPU-{index:08x}-aaaa-bbbb-cccc-{index:012x}", "name": name,
            "bus": f"00000000:{0x18 + 16 * index:02X}:00.0", "driver": driver, "mig": mig, "used": used,
            "total": total, "util": util, "error": error}


def node_gpus(count: int, **fields: Any) -> list[dict[str, Any]]:
    return [gpu(i, **fields) for i in range(count)]


def install_smi(folder: Path, gpus: list[dict[str, Any]] | None = None, *, mode: str = "ok",
                apps: list[dict[str, Any]] | str = (), mig: dict[str, list[dict[str, str]]] | None = None) -> Path:
    """Write `folder`/nvidia-smi answering for `gpus` (`apps`: [{pid, gpu (list position), used MiB}] or "ranks";
    `mig`: {GPU index: [{name, uuid}]}); its calls are logged to `folder`/nvidia-smi.json.calls. Returns folder."""
    folder.mkdir(parents=True, exist_ok=True)
    spec = folder / "nvidia-smi.json"
    spec.write_text(json.dumps({"gpus": gpus or [], "mode": mode, "apps": apps if isinstance(apps, str) else list(apps),
                                "mig": mig or {}}))
    exe = folder / "nvidia-smi"
    exe.write_text(f"#!/bin/sh\nexec {sys.executable} -S -E {STANDIN} {spec} \"$@\"\n")
    exe.chmod(0o755)
    return folder


def calls(folder: Path) -> list[str]:
    """The argument lines the stand-in in `folder` was called with."""
    log = folder / "nvidia-smi.json.calls"
    return log.read_text().splitlines() if log.exists() else []


def fake_torch(folder: Path, version: str = "2.13.0", cuda: str | None = "12.4") -> Path:
    """A folder to put first on PYTHONPATH where the probe reads torch `version` built for `cuda` (None: a CPU
    build), from its metadata and torch/version.py (the probe never imports torch). Not a torch that runs."""
    (folder / f"torch-{version}.dist-info").mkdir(parents=True, exist_ok=True)
    (folder / f"torch-{version}.dist-info" / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n")
    (folder / "torch").mkdir(exist_ok=True)
    (folder / "torch" / "version.py").write_text(f"__version__ = '{version}'\ncuda = {cuda!r}\n")
    return folder
