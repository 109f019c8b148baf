"""train/ddp.py's data and model: a synthetic regression task the same on every rank, an MLP, and the samplers
that deal each epoch's one global order to the ranks from any position in it (what a resume on any world size
needs)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch
from torch import nn
from torch.utils.data import BatchSampler, DistributedSampler, Sampler, TensorDataset

IN_FEATURES = 16


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
