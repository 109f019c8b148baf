"""train/ddp.py's process group: each rank's place in it (`World`), its start under torchrun or alone, the
barrier, how a rank speaks (`say`), and what a failing rank leaves for torchrun (its error file, whole)."""

from __future__ import annotations

import argparse
import inspect
import os
import sys
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import ErrorHandler


def say(msg: str) -> None:
    # One write per line: with several ranks sharing a pipe (and python -u), print()'s
    # separate writes of text and newline could interleave with other ranks' lines.
    sys.stdout.write(msg + "\n")
    sys.stdout.flush()


@dataclass(frozen=True)
class World:
    rank: int
    world_size: int
    local_rank: int
    backend: str
    device: torch.device


def init_distributed(args: argparse.Namespace) -> World:
    cuda = torch.cuda.is_available()
    backend = ("nccl" if cuda else "gloo") if args.backend == "auto" else args.backend
    if backend == "nccl" and not cuda:
        raise RuntimeError("--backend nccl needs CUDA, and none is available")
    launched = "RANK" in os.environ  # set by torchrun
    local_rank = int(os.environ.get("LOCAL_RANK", 0)) if launched else 0
    device = torch.device("cuda", local_rank) if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)  # before init, so NCCL binds each rank to its own GPU
    timeout = timedelta(seconds=args.timeout)
    if launched:
        # env://: RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT come from torchrun. On CUDA, device_id binds the
        # group to this rank's GPU at once (torch >= 2.3): NCCL connects here, not at the first collective, and a
        # rank on the wrong or a shared GPU fails now.
        bound = {"device_id": device} if device.type == "cuda" and _takes_device_id() else {}
        dist.init_process_group(backend, init_method="env://", timeout=timeout, **bound)
    else:
        # A real group of one keeps the code path (DDP, samplers, barriers) identical.
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
    return World(dist.get_rank(), dist.get_world_size(), local_rank, backend, device)


def _takes_device_id() -> bool:
    return "device_id" in inspect.signature(dist.init_process_group).parameters


def barrier(w: World) -> None:
    # NCCL wants to know the device; Gloo takes no device_ids
    if w.device.type == "cuda":
        dist.barrier(device_ids=[w.device.index])
    else:
        dist.barrier()


class AtomicErrorHandler(ErrorHandler):
    """torch's handler writes the error file in place. torchrun stops the other ranks as
    soon as one fails; one stopped while recording its own follow-on error leaves a torn
    file, and torchrun then crashes (JSONDecodeError) instead of printing its root-cause
    report. Write a temp file and rename it: torchrun sees no file or a whole one."""

    def _get_error_file_path(self) -> str | None:
        path = super()._get_error_file_path()
        return f"{path}.{os.getpid()}.tmp" if path else None

    def record_exception(self, e: BaseException) -> None:
        super().record_exception(e)  # to the temp path
        tmp, final = self._get_error_file_path(), super()._get_error_file_path()
        if tmp and final and os.path.exists(tmp):
            os.replace(tmp, final)


def is_comm_error(e: BaseException) -> bool:
    # Gloo raises plain RuntimeErrors that name its sources; NCCL and the store raise
    # DistError (absent from older torch).
    return isinstance(e, getattr(dist, "DistError", ())) or "gloo" in str(e).lower()
