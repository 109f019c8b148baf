"""A tiny Lightning DDP job on CPU (gloo): a BoringModel-like module on random data, nothing downloaded.

Under torchrun, Lightning takes the ranks from the environment (TorchElasticEnvironment). It prints no per-step
lines: its progress bar writes nothing line-wise when stdout is a file, which is what the launcher's workers have.
Knobs for the tests, by environment: BORING_STEPS (default 40), BORING_SLOW_RANK / BORING_SLOW_S (that rank's
training step sleeps this long each step), BORING_STUCK_RANK / BORING_STUCK_STEP (that rank sleeps 600 s in its
training step at that step), BORING_STOP_FILE (every 10 steps the ranks agree whether that file exists, and stop
together when it does: a test ends a long run when it has seen what it waited for), BORING_GPU=1 (each rank on its
GPU, NCCL: the device check), LOSS_LINES=1 (each rank prints its own loss of each step: `loss rank R step S value V`,
V the float's repr, what the launcher's hook must read).
"""

import os
import time

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset


class RandomData(Dataset):
    def __init__(self, size: int, length: int):
        self.data = torch.randn(length, size, generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.data[index]


def _knob(name: str, default: float = -1) -> float:
    return float(os.environ.get(name, default))


class Boring(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(32, 2)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        rank = self.global_rank
        if rank == int(_knob("BORING_STUCK_RANK")) and batch_idx == int(_knob("BORING_STUCK_STEP", 5)):
            time.sleep(600)
        if rank == int(_knob("BORING_SLOW_RANK")):
            time.sleep(_knob("BORING_SLOW_S", 0.2))
        return self.layer(batch).sum()

    def on_train_batch_end(self, outputs: object, batch: torch.Tensor, batch_idx: int) -> None:
        if os.environ.get("LOSS_LINES") == "1" and isinstance(outputs, dict):  # the loss its backward was called on
            value = float(outputs["loss"])
            print(f"loss rank {self.global_rank} step {self.trainer.global_step} value {value!r}", flush=True)
        stop_file = os.environ.get("BORING_STOP_FILE")
        if stop_file and batch_idx % 10 == 9:  # one collective more every 10 steps, after the step's own
            self.trainer.should_stop = self.trainer.strategy.reduce_boolean_decision(os.path.exists(stop_file),
                                                                                     all=False)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.layer.parameters(), lr=0.1)


def main() -> None:
    local = int(os.environ["LOCAL_WORLD_SIZE"])
    nodes = int(os.environ["WORLD_SIZE"]) // local
    steps = int(_knob("BORING_STEPS", 40))
    gpu = os.environ.get("BORING_GPU") == "1"
    trainer = L.Trainer(accelerator="gpu" if gpu else "cpu", devices=local, num_nodes=nodes, strategy="ddp",
                        max_steps=steps,
                        logger=False, enable_checkpointing=False, enable_model_summary=False)
    trainer.fit(Boring(), DataLoader(RandomData(32, 64 * steps), batch_size=4))
    print(f"done rank {trainer.global_rank} steps {trainer.global_step}", flush=True)


if __name__ == "__main__":
    main()
