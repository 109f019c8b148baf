"""Where a rank's Python stack is (pure): its frames, which of them are the user's own, and whether the innermost
frame explains a wait: a torch.distributed call, a backward (DDP's gradient all-reduce), a CUDA synchronisation, a
DataLoader waiting for its workers, a lock, event or queue, or a sleep or wait on the user's own line.

faulthandler shows Python frames only: a `time.sleep(600)` or a `.item()` shows as the user's line, which the node's
agent reads from the file there (`launcher/node/agent/stackdump.py` `source_lines`), so the line says what it waits on:
from the run's copy of the job's script where the file changed since the rank started (people edit a script while it
trains), and not at all where no copy was kept (the verdict then asks /proc: `launcher.watch.verdict`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from launcher.node.wire import RUNS_ROOT

_LIBRARY = re.compile(
    r"/(?:site|dist)-packages/|/lib/python\d+(?:\.\d+)?/|^<|"
    r"/(?:torch|lightning|pytorch_lightning|lightning_fabric|transformers|accelerate)/|"
    + re.escape("/" + RUNS_ROOT.partition("/")[2] + "/")
    + "|"
    + re.escape("/" + RUNS_ROOT.rsplit("/", 2)[1] + "/runs/")
    + r"[^/]+/[^/]+/hook/"
)
"""Not the user's own code: installed packages, the standard library, torch and the trainers around it (also from
a source checkout), and the worker's hook in the run directory (it wraps `Tensor.backward` and optimizer steps), also
where the cache is elsewhere (XDG_CACHE_HOME: `<cache>/ddp-launcher/runs/<run>/<node>/hook/`)."""
_CALL = re.compile(r"([A-Za-z_][\w.]*)\s*\(")
_WRAPPERS = ("wrapper", "_wrapper", "inner", "_fn")
_COLLECTIVE = re.compile(
    r"torch/distributed/(?:distributed_c10d|c10d_logger|_functional_collectives(?:_impl)?|utils)"
    r"\.py$|torch/nn/parallel/distributed\.py$"
)
"""Files whose frames are collectives (a checkpoint's writer under torch/distributed/checkpoint is not one)."""
_BACKWARD = re.compile(r"torch/autograd/(?:graph|__init__)\.py$|torch/_tensor\.py$")
_BACKWARD_CALLS = ("backward", "_engine_run_backward", "grad", "run_backward")
_DATALOADER = re.compile(r"torch/utils/data/dataloader\.py$")
_FETCHING = ("__next__", "_next_data", "_get_data", "_try_get_data")
"""A DataLoader iterator's functions that wait for its workers (a worker forked from `__iter__` has dataloader.py
frames too, but none of these)."""
_WORKER_LOOP = re.compile(r"torch/utils/data/_utils/worker\.py$")
_WAITING = re.compile(
    r"/lib/python\d+(?:\.\d+)?/(?:threading|queue|selectors|multiprocessing/\w+|"
    r"concurrent/futures/\w+)\.py$"
)
"""The standard library's waits: locks, events, conditions, queues, processes, futures, select and poll."""
_SLEEP = re.compile(r"((?:[A-Za-z_][\w]*\.)*(?:sleep|wait\w*))\s*\(")
_SYNC = re.compile(r"((?:[A-Za-z_][\w]*\.)*(?:synchronize|item|cpu|tolist))\s*\(\s*\)")
"""A host-device synchronisation on the user's own line (a hung NCCL kernel keeps it spinning)."""
COLLECTIVE_KINDS = ("collective", "backward")


@dataclass(frozen=True)
class Frame:
    file: str
    line: int
    func: str
    source: str | None = None
    """The line of source, read on the node."""

    @property
    def where(self) -> str:
        return f"{self.file.rsplit('/', 1)[-1]}:{self.line}"

    @property
    def library(self) -> bool:
        return is_library(self.file)

    def call(self) -> str | None:
        """The first call on the frame's line of source (`dist.all_reduce`, `trainer.fit`)."""
        found = _CALL.search(self.source or "")
        return found.group(1) if found else None


@dataclass(frozen=True)
class Wait:
    """What a rank's innermost frame waits on."""

    kind: str
    """collective, backward, cuda, data, lock (from a library's frame); sleep, wait (from the user's own line)."""
    name: str
    """all_reduce, backward, torch.cuda.synchronize, DataLoader.__next__, threading.wait, time.sleep."""
    note: str | None = None
    """What it means, where the name does not say it: DDP's gradient all-reduce."""

    @property
    def collective(self) -> bool:
        """Whether the rank waits for its peers (the other ranks of a collective)."""
        return self.kind in COLLECTIVE_KINDS

    @property
    def on_users_line(self) -> bool:
        """Whether the wait shows only as the user's own line (a call into C: time.sleep, work.wait, .item())."""
        return self.kind in ("sleep", "wait") or (self.kind == "cuda" and self.note is None)


def is_library(path: str) -> bool:
    return bool(_LIBRARY.search(path))


def user_frame(frames: Sequence[Frame]) -> int | None:
    """The index of the user's own frame that led to where the rank is (frames innermost first): the innermost one
    in a file of the user's; None when every frame is a library's."""
    return next((i for i, f in enumerate(frames) if not f.library), None)


def called_back(frames: Sequence[Frame], index: int) -> bool:
    """Whether the user's frame at `index` was called by a library (a trainer's hook: training_step)."""
    return index + 1 < len(frames) and frames[index + 1].library and frames[index].func != "<module>"


def wait_of(frames: Sequence[Frame]) -> Wait | None:
    """What the innermost frame waits on, or None: the rank is busy (computing, writing, or in a call nobody here
    knows to be a wait)."""
    if not frames:
        return None
    inner = frames[0]
    if not inner.library:
        return _on_users_line(inner)
    if _COLLECTIVE.search(inner.file):
        named = next(
            (
                f
                for f in frames
                if "torch/distributed/" in f.file and f.func not in _WRAPPERS and not f.func.startswith("_")
            ),
            inner,
        )
        return Wait("collective", named.func)
    if _BACKWARD.search(inner.file) and inner.func in _BACKWARD_CALLS:
        return Wait("backward", "backward", "DDP's gradient all-reduce")
    if "torch/cuda/" in inner.file and inner.func in ("synchronize", "wait", "wait_event", "wait_stream"):
        return Wait("cuda", f"torch.cuda.{inner.func}", "a CUDA synchronisation")
    if _WAITING.search(inner.file) or _DATALOADER.search(inner.file):
        if any(_DATALOADER.search(f.file) and f.func in _FETCHING for f in _library_run(frames)):
            return Wait("data", "DataLoader.__next__", "the next batch from its workers")
        if _WAITING.search(inner.file):
            module = inner.file.rsplit("/", 2)
            stem = module[-2] if module[-2] in ("multiprocessing", "futures") else module[-1][:-3]
            return Wait("lock", f"{stem}.{inner.func}", "a lock, event or queue")
    # a trainer's own `.item()` (Lightning's logging, HF Trainer's loss): on a GPU, behind the kernels
    return _synchronised(inner.source, "a CUDA synchronisation")


def in_dataset(frames: Sequence[Frame]) -> bool:
    """Whether a DataLoader worker is in the user's dataset code (a user's frame inside its `_worker_loop`), not
    idle on its queue (whose only frames of the user's are those it was forked from)."""
    loop = next((i for i, f in enumerate(frames) if _WORKER_LOOP.search(f.file) and f.func == "_worker_loop"), None)
    user = user_frame(frames)
    return loop is not None and user is not None and user < loop


def _library_run(frames: Sequence[Frame]) -> list[Frame]:
    """The innermost frames up to the first of the user's (what the rank's own call led into)."""
    index = user_frame(frames)
    return list(frames if index is None else frames[:index])


def _on_users_line(frame: Frame) -> Wait | None:
    """A wait that shows only as the user's line: a call into C that sleeps, waits or synchronises."""
    source = frame.source or ""
    found = _SLEEP.search(source)
    if found:
        return Wait("sleep" if found.group(1).endswith("sleep") else "wait", found.group(1))
    return _synchronised(source)


def _synchronised(source: str | None, note: str | None = None) -> Wait | None:
    """A host-device synchronisation called on a line of source: `loss.item()`, or `.item()` of an expression."""
    found = _SYNC.search(source or "")
    if found is None:
        return None
    return Wait("cuda", found.group(1) if "." in found.group(1) else "." + found.group(1), note)
