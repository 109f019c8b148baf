#!/usr/bin/env python3
"""The tests' and benches' reference workload, not an example to copy: start from examples/ddp_minimal.py instead.

It trains with DistributedDataParallel on a synthetic regression task, with what the tests and benches drive: fault
injection (--fail-at, --stop-after-epoch, --sleep-per-step), emulation of a DDP run in one process
(--reference-world-size), an exact resume on any world size, and the printed lines' contract below.

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
When torchrun restarts the workers (TORCHELASTIC_RESTART_COUNT > 0), or the launcher starts the run again
(DDP_LAUNCHER_ATTEMPT > 1: `--retries`, `--on-hang restart`), they resume as with --resume.
--timeout (or $DDP_PG_TIMEOUT_S) bounds how long ranks wait for each other: 300 s by default, not torch's 30 min.
"""

from __future__ import annotations

import argparse
import functools
import os
import socket
import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader

# The modules beside this one (train/ is the script's folder: first on sys.path under torchrun or python). Their
# names start with ddp_ so that none shadows a module of the user's or a library's.
from ddp_checkpoints import (
    CHECKPOINT_FORMAT,
    CHECKPOINT_NAME,
    Position,
    checkpoint_position,
    checksum,
    load_checkpoint,
    nearest_per_rank_batch,
    resume_lines,
    rng_state,
    save_atomic,
    set_rng_state,
)
from ddp_data import ResumableSampler, StepBatches, make_dataset, make_model
from ddp_world import AtomicErrorHandler, World, barrier, init_distributed, is_comm_error, say

PEER_FAILURE_GRACE_S = 5.0
DEFAULT_TIMEOUT_S = 300.0  # torch's own default (30 min for NCCL) is a long blind wait when a rank never comes
TIMEOUT_ENV = "DDP_PG_TIMEOUT_S"
ATTEMPT = "DDP_LAUNCHER_ATTEMPT"  # the launcher's attempt (launcher.node.wire.ATTEMPT_ENV): above 1, a retry


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", choices=["auto", "gloo", "nccl"], default="auto",
                   help="auto: nccl when CUDA is available, else gloo")
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
    p.add_argument("--stop-after-epoch", type=int, default=0,
                   help="exit with code 0 once N epochs are done in total, as if interrupted")
    p.add_argument("--fail-at", type=int, default=0, help="raise during global step N (1-based); 0 = never")
    p.add_argument("--fail-rank", type=int, default=0,
                   help="the global rank that raises for --fail-at; -1 = every rank")
    p.add_argument("--sleep-per-step", type=float, default=0.0, help="seconds to sleep after each step")
    p.add_argument("--nan-at", type=int, default=0, help="--nan-rank's loss is NaN at global step N; 0 = never")
    p.add_argument("--nan-rank", type=int, default=0, help="the global rank whose loss --nan-at makes NaN")
    p.add_argument("--bad-data-rank", type=int, default=-1, help="this rank's targets are shuffled (a bad shard)")
    p.add_argument("--loss-lines", action="store_true", help="each rank prints `loss rank R step S value V`")
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


class Training:
    """One run: its data, its model and where it is (`step`); `run()` trains to the end and says the end lines."""

    def __init__(self, args: argparse.Namespace, w: World) -> None:
        self.args, self.w = args, w
        self.ref_w = args.reference_world_size
        if self.ref_w and w.world_size != 1:
            raise RuntimeError("--reference-world-size is only valid in a single process (no torchrun)")
        # Samplers of the ranks this process trains for: its own, or all emulated ones.
        self.replicas, ranks = (self.ref_w, range(self.ref_w)) if self.ref_w else (w.world_size, [w.rank])

        torch.manual_seed(args.seed)  # same seed everywhere: replicas start equal
        self.dataset = make_dataset(args.seed, args.dataset_size)
        # shuffle seeded by seed + epoch (set_epoch): a new order each epoch, the same on all ranks
        self.samplers = [ResumableSampler(self.dataset, self.replicas, r, args.seed) for r in ranks]

        self.ckpt_path = Path(args.checkpoint_dir) / CHECKPOINT_NAME if args.checkpoint_dir else None
        # torchrun restarting the workers (--max-restarts, a re-formed group) means resume, as a launcher's retry.
        restarts = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0) + int(os.environ.get(ATTEMPT, "1")) - 1
        resume = args.resume or restarts > 0
        ckpt = load_checkpoint(self.ckpt_path, w) if resume and self.ckpt_path is not None else None
        if resume and ckpt is None and w.rank == 0:
            say(f"no checkpoint at {self.ckpt_path}, starting from scratch")
        # A resume keeps the checkpoint's global batch, whatever the world size, as far as it divides.
        self.batch_size = args.batch_size if ckpt is None else nearest_per_rank_batch(ckpt["global_batch"],
                                                                                      self.replicas)
        self.global_batch = self.batch_size * self.replicas
        self.steps_per_epoch = self.steps_from(0)
        if self.steps_per_epoch == 0:
            raise RuntimeError(
                f"--dataset-size {args.dataset_size} gives no full batch of {self.batch_size} per rank for "
                f"{self.replicas} ranks"
            )
        self.pos = Position() if ckpt is None else checkpoint_position(ckpt, self.steps_from)
        # The step count goes on from the checkpoint: with the global batch kept, to the same total.
        epochs_left = max(0, args.epochs - self.pos.epoch)
        self.total_steps = self.pos.step + (self.steps_from(self.pos.sample) + (epochs_left - 1) * self.steps_per_epoch
                                            if epochs_left else 0)
        if args.max_steps > 0:
            self.total_steps = min(self.total_steps, args.max_steps)
        self._model(ckpt)
        self.saved_step = self.step  # the state on disk (if any) is already this one

    def steps_from(self, sample: int) -> int:
        """The full steps left in an epoch whose first `sample` samples are consumed."""
        return self.samplers[0].samples_from(sample) // self.batch_size

    def _model(self, ckpt: dict[str, Any] | None) -> None:
        """The model and its optimizer, from the checkpoint where there is one, wrapped in DDP."""
        args, w = self.args, self.w
        self.module = make_model(args.hidden).to(w.device)
        self.optimizer = torch.optim.SGD(self.module.parameters(), lr=args.lr, momentum=args.momentum)
        if ckpt is not None:
            self.module.load_state_dict(ckpt["model"])
            self.optimizer.load_state_dict(ckpt["optimizer"])
            if "rng" in ckpt:
                set_rng_state(ckpt["rng"], w.device)
            if w.rank == 0:
                assert self.ckpt_path is not None
                for line in resume_lines(ckpt, self.ckpt_path, self.pos, self.replicas, self.batch_size,
                                         args.batch_size):
                    say(line)
        self.step = self.pos.step
        # DDP broadcasts rank 0's parameters at construction and averages gradients in backward.
        self.model = DDP(self.module, device_ids=[w.device.index] if w.device.type == "cuda" else None)
        self.loss_fn = nn.MSELoss()  # a mean, so W per-rank means average to the global-batch mean
        self.shuffle = torch.Generator().manual_seed(args.seed + 1000 + w.rank)  # --bad-data-rank's targets
        if self.step > 0:
            # DDP re-buckets gradients after its first backward pass, and the bucket layout decides the order in
            # which the all-reduce adds the ranks' floats. An uninterrupted run took its first pass long ago; a
            # resumed one must too, or its steps would differ in the last bits. One pass, gradients discarded.
            x, y = self.dataset[:self.batch_size]
            self.loss_fn(self.model(x.to(w.device)), y.to(w.device)).backward()
            self.optimizer.zero_grad(set_to_none=True)

        if w.rank == 0:
            what = f"reference world size {self.ref_w} (one process)" if self.ref_w else f"world size {w.world_size}"
            say(
                f"per-rank batch size {self.batch_size}, {what}, global batch size {self.global_batch}, "
                f"steps per epoch {self.steps_per_epoch}, total steps {self.total_steps}"
            )

    def save(self, epoch: int, sample: int) -> None:
        if self.ckpt_path is None or self.step == self.saved_step:
            return
        if self.steps_from(sample) == 0:
            epoch, sample = epoch + 1, 0
        if self.w.rank == 0:  # replicas are identical, one writer suffices
            save_atomic(
                {
                    "format": CHECKPOINT_FORMAT,
                    "model": self.module.state_dict(),
                    "optimizer": self.optimizer.state_dict(),
                    "step": self.step,
                    "epoch": epoch,
                    "epoch_samples": sample,
                    "global_batch": self.global_batch,
                    "per_rank_batch": self.batch_size,
                    "world_size": self.replicas,
                    "rng": rng_state(self.w.device),
                    "args": vars(self.args),
                },
                self.ckpt_path,
            )
            say(f"checkpoint saved {self.ckpt_path} step {self.step} epoch {epoch} by rank {self.w.rank}")
        barrier(self.w)  # nobody runs ahead (or exits) before the checkpoint is complete
        self.saved_step = self.step

    def run(self) -> None:
        args, w = self.args, self.w
        self.t_start = self.t_log = time.perf_counter()
        self.step_log, self.step_first = self.step, self.step
        epoch, sample = self.pos.epoch, self.pos.sample
        for epoch in range(self.pos.epoch, args.epochs):
            sample = self.pos.sample if epoch == self.pos.epoch else 0
            if self.step >= self.total_steps:
                break
            if 0 < args.stop_after_epoch <= epoch:
                if w.rank == 0:
                    say(f"stopping after epoch {epoch} (--stop-after-epoch); continue with --resume")
                break
            sample = self.epoch(epoch, sample)
            if self.steps_from(sample) > 0:
                break  # --max-steps ended the run inside this epoch
            self.save(epoch + 1, 0)
            sample = 0
            epoch += 1  # the position after a complete epoch (if this was the last one)
        self.save(epoch, sample)  # no-op unless --max-steps stopped between periodic checkpoints
        self.finish()

    def epoch(self, epoch: int, sample: int) -> int:
        """`epoch`'s steps from its `sample`-th sample on, up to the run's last step; the sample it reached."""
        args, w = self.args, self.w
        for s in self.samplers:
            s.set_epoch(epoch, sample)
        loader = DataLoader(
            self.dataset,
            batch_sampler=StepBatches(self.samplers, self.batch_size),
            pin_memory=w.device.type == "cuda",
            # Its own generator (for worker seeds; there are no workers): data loading draws nothing from the
            # global one, whose state a checkpoint then holds as an uninterrupted run has it at that step.
            generator=torch.Generator().manual_seed(args.seed + epoch),
        )
        for x, y in loader:
            if args.fail_at == self.step + 1 and args.fail_rank in (w.rank, -1):
                raise RuntimeError(f"injected failure at step {self.step + 1} on rank {w.rank}")
            x, y = x.to(w.device, non_blocking=True), y.to(w.device, non_blocking=True)
            if args.bad_data_rank == w.rank:
                y = y[torch.randperm(len(y), generator=self.shuffle).to(y.device)]
            self.optimizer.zero_grad(set_to_none=True)
            loss = self.loss_fn(self.model(x), y)
            if args.nan_at == self.step + 1 and args.nan_rank == w.rank:
                loss = loss * float("nan")
            if args.loss_lines:
                say(f"loss rank {w.rank} step {self.step + 1} value {loss.item():.6g}")
            loss.backward()
            self.optimizer.step()
            if args.say_first_step and self.step == self.step_first:
                say(f"first optimizer step rank {w.rank} at wall {time.time():.3f}")
            self.step, sample = self.step + 1, sample + self.global_batch
            if args.log_every > 0 and self.step % args.log_every == 0:
                self.log(epoch, loss)
            if args.checkpoint_every > 0 and self.step % args.checkpoint_every == 0:
                self.save(epoch, sample)
            if args.sleep_per_step > 0:
                time.sleep(args.sleep_per_step)
            if self.step >= self.total_steps:
                break
        return sample

    def log(self, epoch: int, loss: torch.Tensor) -> None:
        """Rank 0's loss line: the mean over the ranks, and the samples per second since the last line."""
        avg = loss.detach().clone()
        dist.all_reduce(avg)  # SUM: Gloo has no AVG
        now = time.perf_counter()
        if self.w.rank == 0:
            rate = (self.step - self.step_log) * self.global_batch / max(now - self.t_log, 1e-9)
            say(f"epoch {epoch} step {self.step} loss {avg.item() / self.w.world_size:.6f} samples/s {rate:.1f}")
        self.t_log, self.step_log = now, self.step

    def finish(self) -> None:
        elapsed = time.perf_counter() - self.t_start
        if self.w.rank == 0:
            rate = (self.step - self.step_first) * self.global_batch / max(elapsed, 1e-9)
            say(f"finished at step {self.step} in {elapsed:.2f}s ({rate:.1f} samples/s)")
            if self.args.save_weights:
                save_atomic({k: v.detach().cpu() for k, v in self.module.state_dict().items()},
                            Path(self.args.save_weights))
        say(f"CHECKSUM rank={self.w.rank} sha256={checksum(self.module)}")


def train(args: argparse.Namespace, w: World) -> None:
    Training(args, w).run()


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
