"""Run train/ddp.py and check what it prints and saves.

Reusable by any test that runs the training program, locally under torchrun or through
the launcher: the parsers accept prefixed lines (e.g. torchrun --tee's "[default0]:").
torch is imported lazily, so importing this module stays cheap.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import os
import re
import signal
import struct
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from devtools.observe import free_port as free_port  # re-exported for the train tests
from devtools.observe import pids_with_env
from tests.support.nodeenv import node_python

if TYPE_CHECKING:
    import torch

REPO = Path(__file__).resolve().parents[1]
TRAIN_SCRIPT = REPO / "train" / "ddp.py"

CHECKSUM_RE = re.compile(r"CHECKSUM rank=(\d+) sha256=([0-9a-f]{64})\b")
START_RE = re.compile(r"\brank (\d+)/(\d+) local_rank (\d+) host (\S+) backend (\S+) device (\S+)")
CHECKPOINT_RE = re.compile(r"checkpoint saved (\S+) step (\d+) epoch (\d+) by rank (\d+)")
INJECTED_FAILURE = "injected failure"
# Tagging each run's environment lets us find its processes (torchrun's workers get
# their own sessions, so a process group would not cover them).
TAG_VAR = "DDP_TRAIN_TEST_RUN"


def torchrun_cmd(nproc: int, port: int, *train_args: str, python: str | None = None) -> list[str]:
    """torchrun of train/ddp.py on this machine, under the nodes' interpreter (declared dependencies only)."""
    return [
        python or node_python(),
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "1",
        "--nproc-per-node",
        str(nproc),
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(port),
        str(TRAIN_SCRIPT),
        *train_args,
    ]


def single_cmd(*train_args: str) -> list[str]:
    return [node_python(), str(TRAIN_SCRIPT), *train_args]


@functools.cache
def import_train_script() -> ModuleType:
    """train/ddp.py as a module, to test its pure parts in this process (imports torch: a second or two)."""
    if str(TRAIN_SCRIPT.parent) not in sys.path:  # its modules beside it, as when it runs as a script
        sys.path.insert(0, str(TRAIN_SCRIPT.parent))
    spec = importlib.util.spec_from_file_location("train_ddp", TRAIN_SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@dataclass
class RunResult:
    cmd: list[str]
    returncode: int
    output: str  # stdout and stderr interleaved, as a user would see them
    seconds: float

    def describe(self) -> str:
        return f"$ {' '.join(self.cmd)}\nexit {self.returncode} after {self.seconds:.1f}s\n{self.output}"


def _tagged_pids(tag: str) -> list[int]:
    return pids_with_env(f"{TAG_VAR}={tag}".encode())  # the tag is a uuid: no other tag starts with it


def _reap(tag: str, grace: float) -> list[int]:
    """Wait up to `grace` s for the run's processes to exit; SIGKILL and return any left."""
    deadline = time.monotonic() + grace
    while (pids := _tagged_pids(tag)) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return pids


def run(cmd: Sequence[str], *, timeout: float = 120, env: Mapping[str, str | None] | None = None) -> RunResult:
    """Run a command to completion; fail if it times out or leaves processes behind.

    `env` adds to this process's environment; a None value removes that variable."""
    tag = uuid.uuid4().hex
    merged = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **(env or {}), TAG_VAR: tag}
    full_env = {k: v for k, v in merged.items() if v is not None}
    start = time.monotonic()
    proc = subprocess.Popen(
        list(cmd),
        cwd=REPO,
        env=full_env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _reap(tag, 0)
        output, _ = proc.communicate()
        raise AssertionError(f"timed out after {timeout}s: {' '.join(cmd)}\n{output}") from None
    finally:
        leftovers = _reap(tag, 10)
    result = RunResult(list(cmd), proc.returncode, output, time.monotonic() - start)
    assert not leftovers, f"processes {leftovers} outlived the run\n{result.describe()}"
    return result


def parse_checksums(output: str) -> list[tuple[int, str]]:
    """(rank, sha256) of every CHECKSUM line, in output order."""
    return [(int(m[1]), m[2]) for m in CHECKSUM_RE.finditer(output)]


def assert_replicas_in_sync(output: str, world_size: int) -> str:
    """Exactly one CHECKSUM line per rank 0..world_size-1, all equal; returns the hash."""
    found = parse_checksums(output)
    ranks = sorted(rank for rank, _ in found)
    assert ranks == list(range(world_size)), f"CHECKSUM ranks {ranks}, expected 0..{world_size - 1}"
    hashes = {h for _, h in found}
    assert len(hashes) == 1, f"replicas diverged: {found}"
    return hashes.pop()


def parse_start_lines(output: str) -> list[dict[str, Any]]:
    keys = ("rank", "world_size", "local_rank", "host", "backend", "device")
    return [
        {k: int(v) if v.isdigit() else v for k, v in zip(keys, m.groups(), strict=True)}
        for m in START_RE.finditer(output)
    ]


def parse_checkpoint_lines(output: str) -> list[dict[str, Any]]:
    return [
        {"path": m[1], "step": int(m[2]), "epoch": int(m[3]), "rank": int(m[4])} for m in CHECKPOINT_RE.finditer(output)
    ]


def torchrun_root_cause(output: str) -> str:
    """The "Root Cause (first observed failure)" section of torchrun's failure report, or ""."""
    _, found, rest = output.partition("Root Cause (first observed failure):")
    return rest.split("=" * 20)[0] if found else ""


def load(path: str | os.PathLike[str]) -> Any:
    import torch

    return torch.load(path, map_location="cpu", weights_only=True)


def state_dict_checksum(state: Mapping[str, torch.Tensor]) -> str:
    """The program's CHECKSUM: sha256 over the state_dict's tensors, in order, as float32 bytes (C order, native
    byte order). Packed from the values with struct, not read from memory as the program does: an independent
    check, and no numpy (neither torch nor this project depends on it)."""
    import torch

    h = hashlib.sha256()
    for t in state.values():
        values = t.detach().to("cpu", torch.float32).flatten().tolist()  # float32 -> float -> "f" is exact
        h.update(struct.pack(f"={len(values)}f", *values))
    return h.hexdigest()


def max_abs_diff(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor]) -> float:
    assert list(a) == list(b), f"different keys: {list(a)} vs {list(b)}"
    worst = 0.0
    for k in a:
        assert a[k].shape == b[k].shape, f"{k}: shape {tuple(a[k].shape)} vs {tuple(b[k].shape)}"
        worst = max(worst, (a[k].double() - b[k].double()).abs().max().item())
    return worst


def assert_state_dicts_close(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor], atol: float = 1e-5) -> None:
    diff = max_abs_diff(a, b)
    assert diff <= atol, f"state dicts differ by {diff:.3g} > {atol:g}"


def assert_state_dicts_equal(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor]) -> None:
    import torch

    diff = max_abs_diff(a, b)
    assert all(torch.equal(a[k], b[k]) for k in a), f"state dicts differ (max {diff:.3g})"
