#!/usr/bin/env python3
"""Data-parallel training with DistributedDataParallel on a synthetic regression task.

Under torchrun (one process per GPU; with Gloo, per CPU slot):

    python -m torch.distributed.run --nnodes 2 --node-rank 0 --nproc-per-node 4 \\
        --master-addr HOST --master-port 29500 train/ddp.py --epochs 2

or alone, as a world of one process: ``python train/ddp.py``.

Lines other programs may parse (stdout; each written whole, so ranks' lines never mix):
  rank R/W local_rank L host H backend B device D     every rank, first
  per-rank batch size B, world size W, global batch size G, steps per epoch N, total steps T
                                                      rank 0, once
  epoch E step S loss L samples/s X                   rank 0, every --log-every steps
  resumed from PATH at step S epoch E batch K         rank 0, with --resume: K steps of the checkpoint's
                                                      global batch into epoch E ("sample N" instead of
                                                      "batch K" where its samples are no whole number of them)
  resuming at step S (epoch E, sample K) on world size W (was V): per-rank batch B keeps the global batch G
  resuming at step S (epoch E, sample K) on world size W (was V): per-rank batch B makes the global batch H
    instead of G: WHY                                 rank 0, with --resume, after the line above, where the
                                                      world size or --batch-size differs from the checkpoint's
  checkpoint saved PATH step S epoch E by rank 0      rank 0, after each save; E is the
                                                      epoch a resume continues in
  stopping after epoch N (--stop-after-epoch) ...     rank 0
  finished at step S in Ts (X samples/s)              rank 0
  CHECKSUM rank=R sha256=<64 hex>                     every rank, last (also after a stop)
  first optimizer step rank R at wall T               every rank, with --say-first-step (T: time.time())
--fail-at S --fail-rank R makes rank R raise RuntimeError("injected failure at step S on
rank R") before its S-th optimizer step (1-based global count: a run resumed past S goes on).

--resume on another world size W' keeps the checkpoint's global batch G (per-rank batch G/W', or the one nearest
to it where W' does not divide G), goes on with its step count, and re-shards the rest of the epoch: every
epoch's samples are consumed in one global order, whatever the world size, so the samples consumed before the
checkpoint are a prefix of it and are skipped. Given the checkpoint and the world size, a resume is deterministic:
bit for bit on the same topology (world size, and on GPUs the same GPU models, NCCL and its algorithm choices,
which decide the order an all_reduce adds in) and, on CUDA, with deterministic cuBLAS
(CUBLAS_WORKSPACE_CONFIG=:4096:8 and torch.use_deterministic_algorithms(True)); elsewhere it resumes from the same
state, whose steps may differ in their last bits.
When torchrun restarts the workers (TORCHELASTIC_RESTART_COUNT > 0) they resume as with --resume.
--timeout (or $DDP_PG_TIMEOUT_S) bounds how long ranks wait for each other: 300 s by default, not torch's 30 min.
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import hashlib
import inspect
import io
import os
import socket
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.elastic.multiprocessing.errors import ErrorHandler, record
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import BatchSampler, DataLoader, DistributedSampler, Sampler, TensorDataset

IN_FEATURES = 16
CHECKPOINT_NAME = "checkpoint.pt"
CHECKPOINT_FORMAT = 2  # 2: the epoch position in samples, the world size, the RNG states
PEER_FAILURE_GRACE_S = 5.0
DEFAULT_TIMEOUT_S = 300.0  # torch's own default (30 min for NCCL) is a long blind wait when a rank never comes
TIMEOUT_ENV = "DDP_PG_TIMEOUT_S"


def say(msg: str) -> None:
    # One write per line: with several ranks sharing a pipe (and python -u), print()'s
    # separate writes of text and newline could interleave with other ranks' lines.
    sys.stdout.write(msg + "\n")
    sys.stdout.flush()


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--backend",
        choices=["auto", "gloo", "nccl"],
        default="auto",
        help="auto: nccl when CUDA is available, else gloo",
    )
    p.add_argument("--timeout", type=float, default=float(os.environ.get(TIMEOUT_ENV) or DEFAULT_TIMEOUT_S),
                   help=f"process-group timeout in seconds (how long a rank waits for a peer that never comes); "
                   f"default ${TIMEOUT_ENV}, else {DEFAULT_TIMEOUT_S:g}")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dataset-size", type=int, default=4096)
    p.add_argument("--hidden", type=int, default=64, help="width of the MLP's hidden layer")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--max-steps", type=int, default=0, help="stop after this many global steps; 0 = no limit")
    p.add_argument(
        "--batch-size",
        type=int,
        default=32,
        help="per-rank batch size; on --resume the checkpoint's global batch decides it",
    )
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--log-every", type=int, default=10, help="steps between loss logs; 0 = never")
    p.add_argument("--checkpoint-dir", default=None, help="no checkpoints when unset")
    p.add_argument(
        "--checkpoint-every",
        type=int,
        default=0,
        help="save every K steps; 0 = only at the end of each epoch (and of the run)",
    )
    p.add_argument("--resume", action="store_true", help="continue from CHECKPOINT_DIR/checkpoint.pt if it exists")
    p.add_argument(
        "--stop-after-epoch",
        type=int,
        default=0,
        help="exit with code 0 once N epochs are done in total, as if interrupted",
    )
    p.add_argument("--fail-at", type=int, default=0, help="raise during global step N (1-based); 0 = never")
    p.add_argument("--fail-rank", type=int, default=0,
                   help="the global rank that raises for --fail-at; -1 = every rank")
    p.add_argument("--sleep-per-step", type=float, default=0.0, help="seconds to sleep after each step")
    p.add_argument("--say-first-step", action="store_true",
                   help="every rank says when (wall clock) its first optimizer step returned: the bench's figure of "
                        "command -> first step, measured the same way under any launcher")
    p.add_argument("--save-weights", default=None, help="rank 0 saves the final model state_dict here")
    p.add_argument(
        "--reference-world-size",
        type=int,
        default=0,
        help="single process only: emulate a DDP run of W ranks (one step = the union of their batches)",
    )
    args = p.parse_args(argv)
    for name in ("dataset_size", "batch_size", "hidden"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.resume and not args.checkpoint_dir:
        p.error("--resume needs --checkpoint-dir")
    return args


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


def make_dataset(seed: int, size: int) -> TensorDataset:
    # Its own generator: identical on every rank and independent of model init.
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(size, IN_FEATURES, generator=g)
    w1 = torch.randn(IN_FEATURES, 32, generator=g) / IN_FEATURES**0.5
    w2 = torch.randn(32, 1, generator=g) / 32**0.5
    y = torch.tanh(x @ w1) @ w2 + 0.05 * torch.randn(size, 1, generator=g)
    return TensorDataset(x, y)


def make_model(hidden: int) -> nn.Module:
    # No dropout or batch norm: nothing rank-dependent, so W ranks equal one big batch.
    return nn.Sequential(nn.Linear(IN_FEATURES, hidden), nn.ReLU(), nn.Linear(hidden, 1))


class ResumableSampler(DistributedSampler):
    """DistributedSampler (shuffled, drop_last) whose epoch can begin `start` samples into the epoch's global order.

    The global order is the epoch's shuffled permutation. Rank r's i-th sample is its position r + W*i, so with
    per-rank batch B, step k takes positions [kG, (k+1)G) for G = W*B, whatever W and B are: the samples consumed
    before a checkpoint are a prefix of the order. The rest is dealt round-robin to this sampler's ranks, as
    DistributedSampler deals a whole epoch; with W unchanged that is exactly the stream a run that went on would
    have seen. Skipping index lists, not loaded batches: resuming costs no data loading.
    """

    def __init__(self, dataset: TensorDataset, num_replicas: int, rank: int, seed: int) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=True, seed=seed, drop_last=True)
        self.start = 0

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        """Shuffle for `epoch` (seed + epoch, as DistributedSampler), beginning after its first `start` samples."""
        super().set_epoch(epoch)
        self.start = start

    def samples_from(self, start: int) -> int:
        """This rank's share of the epoch from global position `start` on: equal on all ranks, the tail dropped."""
        return (len(self.dataset) - start) // self.num_replicas

    def __iter__(self) -> Iterator[int]:
        if self.start == 0:
            return super().__iter__()
        # The epoch's whole order is what a one-rank DistributedSampler of the same seed and epoch draws.
        whole = DistributedSampler(self.dataset, num_replicas=1, rank=0, shuffle=True, seed=self.seed, drop_last=True)
        whole.set_epoch(self.epoch)
        rest = list(whole)[self.start :]
        end = self.samples_from(self.start) * self.num_replicas
        return iter(rest[self.rank : end : self.num_replicas])

    def __len__(self) -> int:
        return self.samples_from(self.start)


class StepBatches(Sampler[list[int]]):
    """The sample indices of each optimizer step of one epoch (from where the samplers' epochs start).

    Normally `samplers` is this rank's sampler. With --reference-world-size it holds one per
    emulated rank, and a step's batch is the union of their batches.
    """

    def __init__(self, samplers: Sequence[ResumableSampler], batch_size: int) -> None:
        self.samplers, self.batch_size = samplers, batch_size

    def _per_rank(self) -> list[BatchSampler]:
        # drop_last: every step sees full, equal-size batches on every rank
        return [BatchSampler(s, self.batch_size, drop_last=True) for s in self.samplers]

    def __iter__(self) -> Iterator[list[int]]:
        for batches in zip(*self._per_rank(), strict=True):
            yield [i for batch in batches for i in batch]

    def __len__(self) -> int:
        return len(self._per_rank()[0])


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
        buffer = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(w.device) if data else \
            torch.empty(0, dtype=torch.uint8, device=w.device)
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


def barrier(w: World) -> None:
    # NCCL wants to know the device; Gloo takes no device_ids
    if w.device.type == "cuda":
        dist.barrier(device_ids=[w.device.index])
    else:
        dist.barrier()


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


def train(args: argparse.Namespace, w: World) -> None:
    ref_w = args.reference_world_size
    if ref_w and w.world_size != 1:
        raise RuntimeError("--reference-world-size is only valid in a single process (no torchrun)")
    # Samplers of the ranks this process trains for: its own, or all emulated ones.
    replicas, ranks = (ref_w, range(ref_w)) if ref_w else (w.world_size, [w.rank])

    torch.manual_seed(args.seed)  # same seed everywhere: replicas start equal
    dataset = make_dataset(args.seed, args.dataset_size)
    # shuffle seeded by seed + epoch (set_epoch): a new order each epoch, the same on all ranks
    samplers = [ResumableSampler(dataset, replicas, r, args.seed) for r in ranks]

    ckpt_path = Path(args.checkpoint_dir) / CHECKPOINT_NAME if args.checkpoint_dir else None
    # torchrun restarting the workers (--max-restarts, an elastic group that re-formed) means resume too.
    resume = args.resume or int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0) > 0
    ckpt = load_checkpoint(ckpt_path, w) if resume and ckpt_path is not None else None
    if resume and ckpt is None and w.rank == 0:
        say(f"no checkpoint at {ckpt_path}, starting from scratch")
    # A resume keeps the checkpoint's global batch, whatever the world size, as far as it divides.
    batch_size = args.batch_size if ckpt is None else nearest_per_rank_batch(ckpt["global_batch"], replicas)
    global_batch = batch_size * replicas

    def steps_from(sample: int) -> int:
        """The full steps left in an epoch whose first `sample` samples are consumed."""
        return samplers[0].samples_from(sample) // batch_size

    steps_per_epoch = steps_from(0)
    if steps_per_epoch == 0:
        raise RuntimeError(
            f"--dataset-size {args.dataset_size} gives no full batch of {batch_size} per rank for {replicas} ranks"
        )
    pos = Position() if ckpt is None else checkpoint_position(ckpt, steps_from)
    # The step count goes on from the checkpoint: with the global batch kept, to the same total.
    epochs_left = max(0, args.epochs - pos.epoch)
    total_steps = pos.step + (steps_from(pos.sample) + (epochs_left - 1) * steps_per_epoch if epochs_left else 0)
    if args.max_steps > 0:
        total_steps = min(total_steps, args.max_steps)

    module = make_model(args.hidden).to(w.device)
    optimizer = torch.optim.SGD(module.parameters(), lr=args.lr, momentum=args.momentum)
    if ckpt is not None:
        module.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        if "rng" in ckpt:
            set_rng_state(ckpt["rng"], w.device)
        if w.rank == 0:
            for line in resume_lines(ckpt, ckpt_path, pos, replicas, batch_size, args.batch_size):
                say(line)
    step = pos.step
    # DDP broadcasts rank 0's parameters at construction and averages gradients in backward.
    model = DDP(module, device_ids=[w.device.index] if w.device.type == "cuda" else None)
    loss_fn = nn.MSELoss()  # a mean, so W per-rank means average to the global-batch mean
    if step > 0:
        # DDP re-buckets gradients after its first backward pass, and the bucket layout decides the order in
        # which the all-reduce adds the ranks' floats. An uninterrupted run took its first pass long ago; a
        # resumed one must too, or its steps would differ in the last bits. One pass, gradients discarded.
        x, y = dataset[:batch_size]
        loss_fn(model(x.to(w.device)), y.to(w.device)).backward()
        optimizer.zero_grad(set_to_none=True)

    if w.rank == 0:
        what = f"reference world size {ref_w} (one process)" if ref_w else f"world size {w.world_size}"
        say(
            f"per-rank batch size {batch_size}, {what}, global batch size {global_batch}, "
            f"steps per epoch {steps_per_epoch}, total steps {total_steps}"
        )

    saved_step = step  # the state on disk (if any) is already this one

    def save(epoch: int, sample: int) -> None:
        nonlocal saved_step
        if ckpt_path is None or step == saved_step:
            return
        if steps_from(sample) == 0:
            epoch, sample = epoch + 1, 0
        if w.rank == 0:  # replicas are identical, one writer suffices
            save_atomic(
                {
                    "format": CHECKPOINT_FORMAT,
                    "model": module.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "step": step,
                    "epoch": epoch,
                    "epoch_samples": sample,
                    "global_batch": global_batch,
                    "per_rank_batch": batch_size,
                    "world_size": replicas,
                    "rng": rng_state(w.device),
                    "args": vars(args),
                },
                ckpt_path,
            )
            say(f"checkpoint saved {ckpt_path} step {step} epoch {epoch} by rank {w.rank}")
        barrier(w)  # nobody runs ahead (or exits) before the checkpoint is complete
        saved_step = step

    t_start = t_log = time.perf_counter()
    step_log, step_first = step, step
    epoch, sample = pos.epoch, pos.sample
    for epoch in range(pos.epoch, args.epochs):
        sample = pos.sample if epoch == pos.epoch else 0
        if step >= total_steps:
            break
        if 0 < args.stop_after_epoch <= epoch:
            if w.rank == 0:
                say(f"stopping after epoch {epoch} (--stop-after-epoch); continue with --resume")
            break
        for s in samplers:
            s.set_epoch(epoch, sample)
        loader = DataLoader(
            dataset,
            batch_sampler=StepBatches(samplers, batch_size),
            pin_memory=w.device.type == "cuda",
            # Its own generator (for worker seeds; there are no workers): data loading draws nothing from the
            # global one, whose state a checkpoint then holds as an uninterrupted run has it at that step.
            generator=torch.Generator().manual_seed(args.seed + epoch),
        )
        for x, y in loader:
            if args.fail_at == step + 1 and args.fail_rank in (w.rank, -1):
                raise RuntimeError(f"injected failure at step {step + 1} on rank {w.rank}")
            x, y = x.to(w.device, non_blocking=True), y.to(w.device, non_blocking=True)
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
            if args.say_first_step and step == step_first:
                say(f"first optimizer step rank {w.rank} at wall {time.time():.3f}")
            step, sample = step + 1, sample + global_batch
            if args.log_every > 0 and step % args.log_every == 0:
                avg = loss.detach().clone()
                dist.all_reduce(avg)  # SUM: Gloo has no AVG
                now = time.perf_counter()
                if w.rank == 0:
                    rate = (step - step_log) * global_batch / max(now - t_log, 1e-9)
                    say(f"epoch {epoch} step {step} loss {avg.item() / w.world_size:.6f} samples/s {rate:.1f}")
                t_log, step_log = now, step
            if args.checkpoint_every > 0 and step % args.checkpoint_every == 0:
                save(epoch, sample)
            if args.sleep_per_step > 0:
                time.sleep(args.sleep_per_step)
            if step >= total_steps:
                break
        if steps_from(sample) > 0:
            break  # --max-steps ended the run inside this epoch
        save(epoch + 1, 0)
        sample = 0
        epoch += 1  # the position after a complete epoch (if this was the last one)
    save(epoch, sample)  # no-op unless --max-steps stopped between periodic checkpoints

    elapsed = time.perf_counter() - t_start
    if w.rank == 0:
        rate = (step - step_first) * global_batch / max(elapsed, 1e-9)
        say(f"finished at step {step} in {elapsed:.2f}s ({rate:.1f} samples/s)")
        if args.save_weights:
            save_atomic({k: v.detach().cpu() for k, v in module.state_dict().items()}, Path(args.save_weights))
    say(f"CHECKSUM rank={w.rank} sha256={checksum(module)}")


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


# A crash's traceback goes to torchrun's error file and from there to its root-cause report.
@functools.partial(record, error_handler=AtomicErrorHandler())
def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    w = init_distributed(args)
    try:
        say(
            f"rank {w.rank}/{w.world_size} local_rank {w.local_rank} host {socket.gethostname()} "
            f"backend {w.backend} device {w.device}"
        )
        train(args, w)
    except Exception as e:
        if w.world_size > 1 and is_comm_error(e):
            # Most likely a peer crashed and broke the connection. torchrun names the earliest
            # error as the root cause (1 s resolution, ties to the lowest rank), which would
            # often be this follow-on error; wait, so torchrun sees the crash first and stops us.
            time.sleep(PEER_FAILURE_GRACE_S)
        raise
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    try:
        code = main() or 0  # @record turns SystemExit(0) (--help) into None
    except Exception:
        traceback.print_exc()  # @record has already written torchrun's error file
        code = 1
    # Skip the interpreter's teardown. Gloo's worker threads outlive destroy_process_group
    # (DDP keeps the group referenced) and may still be freeing the last backward's
    # allreduce, which needs the GIL; in a finalizing interpreter that aborts the process
    # (SIGABRT, "terminate called without an active exception") after a good run.
    # Everything is saved, fsynced and flushed by now.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
