"""A minimal DistributedDataParallel script to copy: `torchrun --nproc-per-node 2 ddp_minimal.py`, or `ddpl launch`."""

import argparse
import os
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="A minimal DDP training script.")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32, help="per process: the global batch is this x world")
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--checkpoint-dir", type=Path, default=Path("checkpoints"))
    parser.add_argument("--resume", action="store_true", help="go on from the last checkpoint, if there is one")
    return parser.parse_args()


def synthetic_dataset(size: int = 1024) -> TensorDataset:
    # One seed on every rank: the same data everywhere, of which DistributedSampler gives each rank its own share.
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(size, 16, generator=generator)
    y = x @ torch.randn(16, 1, generator=generator) + 0.1 * torch.randn(size, 1, generator=generator)
    return TensorDataset(x, y)


def save_checkpoint(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer, epochs_done: int) -> None:
    # A temporary file, then a rename: a crash during the save never leaves half a checkpoint behind.
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epochs_done}, tmp)
    os.replace(tmp, path)


def main() -> None:
    args = parse_args()
    # torchrun sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT; init_process_group reads them.
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)  # LOCAL_RANK: this process's GPU on its node
    dist.init_process_group("nccl" if cuda else "gloo")
    rank = dist.get_rank()

    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    checkpoint, start_epoch = args.checkpoint_dir / "checkpoint.pt", 0
    # A restart resumes too: the launcher's next attempt (--retries) is told in DDP_LAUNCHER_ATTEMPT, torchrun's own
    # (--max-restarts) in TORCHELASTIC_RESTART_COUNT; neither adds an argument.
    restarted = (
        int(os.environ.get("DDP_LAUNCHER_ATTEMPT", "1")) > 1
        or int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0
    )
    if (args.resume or restarted) and checkpoint.exists():
        # Every rank loads it (the optimizer's state too), so --checkpoint-dir must be on a disk all nodes share.
        state = torch.load(checkpoint, map_location=device)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start_epoch = state["epoch"]
    # Ranks that started at different epochs would wait for each other for ever: each checks it starts at rank 0's.
    epoch0 = torch.tensor([start_epoch], device=device)
    dist.broadcast(epoch0, src=0)
    if epoch0.item() != start_epoch:
        raise RuntimeError(f"rank {rank} is at epoch {start_epoch}, rank 0 at {epoch0.item()}: a shared disk?")
    if rank == 0 and args.resume:
        print(f"resumed from epoch {start_epoch}" if start_epoch else f"no checkpoint at {checkpoint}: starting afresh")
    # DDP copies rank 0's weights to every rank here, then averages the gradients across ranks in backward().
    ddp_model = DDP(model, device_ids=[device.index] if cuda else None)

    dataset = synthetic_dataset()
    sampler = DistributedSampler(dataset)  # each rank a different shard of every epoch
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)
    for epoch in range(start_epoch, args.epochs):
        sampler.set_epoch(epoch)  # without it every epoch would shuffle the same way
        for i, (x, y) in enumerate(loader):
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(ddp_model(x), y)
            loss.backward()
            optimizer.step()
            step = epoch * len(loader) + i + 1  # counted over the whole run, so that a resumed run goes on from it
            if rank == 0 and step % 10 == 0:  # a loss line every 10 steps
                print(f"epoch {epoch} step {step} loss {loss.item():.4f}", flush=True)
        if rank == 0:  # the weights are the same on every rank: one writer is enough
            save_checkpoint(checkpoint, model, optimizer, epoch + 1)  # model, not ddp_model: no "module." in keys
            print(f"checkpoint saved {checkpoint} epoch {epoch + 1}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
