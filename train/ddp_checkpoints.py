"""train/ddp.py's checkpoints: written atomically by rank 0, read by every rank (rank 0's bytes where a rank's own
copy is missing or differs: no shared filesystem needed), the position a resume goes on from, what rank 0 says of
it, and the weights' checksum every rank prints last. Tensor collectives only, never numpy: a node's torch may
have none."""

from __future__ import annotations

import ctypes
import hashlib
import io
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ddp_world import World, say

CHECKPOINT_NAME = "checkpoint.pt"
CHECKPOINT_FORMAT = 2  # 2: the epoch position in samples, the world size, the RNG states


def float32_bytes(t: torch.Tensor) -> bytes:
    """The tensor's values as float32 in C order and native byte order (what numpy's tobytes() gives).

    Read straight from the contiguous CPU copy's memory: torch does not depend on numpy, so a node may lack it.
    """
    t = t.detach().to("cpu", torch.float32).contiguous()
    return ctypes.string_at(t.data_ptr(), t.nbytes)


def checksum(module: nn.Module) -> str:
    """sha256 over the state_dict's tensors, in order, as float32 bytes: equal on every rank whose weights are."""
    h = hashlib.sha256()
    for t in module.state_dict().values():
        h.update(float32_bytes(t))
    return h.hexdigest()


def save_atomic(obj: Any, path: Path) -> None:
    """Write to a temp file in the same directory, fsync, rename: readers see the old
    file or the complete new one, never a torn write, even if we die mid-save."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp.{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # persist the rename itself
    finally:
        os.close(dir_fd)


def _as_bytes(t: torch.Tensor) -> bytes:
    """A uint8 tensor's bytes (read from the CPU copy's memory: no numpy, see float32_bytes)."""
    t = t.detach().to("cpu", torch.uint8).contiguous()
    return ctypes.string_at(t.data_ptr(), t.numel())


def _gather_digests(data: bytes | None, w: World) -> list[bytes | None]:
    """Every rank's sha256 of its checkpoint bytes (None: no file), with tensor collectives only.

    Not all_gather_object: in torch 2.13 it calls tensor.numpy() on CPU tensors, and torch does not depend on
    numpy, so a node built from torch alone failed every resume with `Numpy is not available`.
    """
    mine = torch.zeros(33, dtype=torch.uint8)  # a presence byte, then the digest
    if data is not None:
        mine[0] = 1
        mine[1:] = torch.frombuffer(bytearray(hashlib.sha256(data).digest()), dtype=torch.uint8)
    mine = mine.to(w.device)
    gathered = [torch.empty_like(mine) for _ in range(w.world_size)]
    dist.all_gather(gathered, mine)
    rows = [_as_bytes(t) for t in gathered]
    return [row[1:] if row[0] else None for row in rows]


def _broadcast_bytes(data: bytes | None, w: World) -> bytes:
    """Rank 0's `data` on every rank: its length, then its bytes, as uint8 tensors (no pickling, no numpy)."""
    size = torch.tensor([len(data) if w.rank == 0 and data is not None else 0], dtype=torch.int64, device=w.device)
    dist.broadcast(size, src=0)
    if w.rank == 0 and data is not None:
        buffer = (
            torch.frombuffer(bytearray(data), dtype=torch.uint8).to(w.device)
            if data
            else torch.empty(0, dtype=torch.uint8, device=w.device)
        )
    else:
        buffer = torch.empty(int(size.item()), dtype=torch.uint8, device=w.device)
    dist.broadcast(buffer, src=0)
    return _as_bytes(buffer)


def load_checkpoint(path: Path, w: World) -> dict[str, Any] | None:
    """Every rank loads the checkpoint onto its own device. Without a shared filesystem
    only rank 0's node has the current file; a rank whose copy is missing or differs gets
    rank 0's bytes over the process group, so that all ranks resume from the same state."""
    data = path.read_bytes() if path.exists() else None
    digests = _gather_digests(data, w)
    if digests[0] is None:
        if data is not None:
            say(f"rank {w.rank}: ignoring {path}: rank 0 has no checkpoint")
        return None
    if any(d != digests[0] for d in digests):
        payload = _broadcast_bytes(data, w)
        if digests[w.rank] != digests[0]:
            say(f"rank {w.rank}: local checkpoint missing or different, using rank 0's")
            data = payload
    assert data is not None
    return torch.load(io.BytesIO(data), map_location=w.device, weights_only=True)


@dataclass(frozen=True)
class Position:
    """Where training goes on: `step` optimizer steps taken, the first `sample` samples of `epoch`'s order consumed."""

    step: int = 0
    epoch: int = 0
    sample: int = 0


def nearest_per_rank_batch(global_batch: int, world_size: int) -> int:
    """The per-rank batch whose global batch on `world_size` ranks comes nearest `global_batch`: the quotient where
    it divides; else the nearer of its two neighbours (the smaller on a tie: it needs less memory), at least 1."""
    lo = max(1, global_batch // world_size)
    return lo + 1 if (lo + 1) * world_size - global_batch < global_batch - lo * world_size else lo


def checkpoint_position(ckpt: dict[str, Any], steps_from: Callable[[int], int]) -> Position:
    """The position a checkpoint records; an epoch with no full step left for `steps_from` gives way to the next."""
    # Checkpoints without the format field counted the epoch in steps of their own global batch.
    sample = ckpt["epoch_samples"] if "format" in ckpt else ckpt["epoch_step"] * ckpt["global_batch"]
    if steps_from(sample) == 0:
        return Position(ckpt["step"], ckpt["epoch"] + 1, 0)
    return Position(ckpt["step"], ckpt["epoch"], sample)


def resume_lines(
    ckpt: dict[str, Any], path: Path, pos: Position, world_size: int, batch_size: int, asked_batch: int
) -> list[str]:
    """What rank 0 says on resuming: where; and, with another world size or a per-rank batch other than the one
    asked for, how the global batch fares."""
    was_batch, was_world = ckpt["global_batch"], ckpt["world_size"]
    where = f"batch {pos.sample // was_batch}" if pos.sample % was_batch == 0 else f"sample {pos.sample}"
    lines = [f"resumed from {path} at step {pos.step} epoch {pos.epoch} {where}"]
    head = (
        f"resuming at step {pos.step} (epoch {pos.epoch}, sample {pos.sample}) "
        f"on world size {world_size} (was {was_world}): per-rank batch {batch_size}"
    )
    global_batch = batch_size * world_size
    if global_batch == was_batch:
        lines.append(f"{head} keeps the global batch {global_batch}")
    else:
        lines.append(
            f"{head} makes the global batch {global_batch} instead of {was_batch}: {was_batch} samples do not "
            f"split evenly over {world_size} ranks, and {batch_size} per rank comes nearest"
        )
    return lines[:1] if world_size == was_world and batch_size == asked_batch else lines


def rng_state(device: torch.device) -> dict[str, torch.Tensor]:
    """The global generators' states. Training draws from none of them today (no dropout; the samplers and the
    data loader have their own), but a model that did would need them to resume exactly."""
    state = {"torch": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict[str, torch.Tensor], device: torch.device) -> None:
    torch.set_rng_state(state["torch"].cpu())  # load_checkpoint maps tensors to the device; these must be on the CPU
    if "cuda" in state and device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"].cpu(), device)
