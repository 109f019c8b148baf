"""What the workers' progress hook (launcher/node/hook.py) costs a training step: `python -m bench.hook_cost`.

1. The hook alone: one step's calls (a batch drawn through the wrapped `__next__`, the wrapped `backward`, the
   optimizer's step post hook writing the record) against the same calls unwrapped, with originals that do
   nothing: the cost the hook adds, in microseconds a step.
2. A real torch loop (a tiny Linear model, SGD, a DataLoader in the process: about 0.2 ms a step, where the hook
   weighs most) in one process under the hook, its patches taken off and put back round after round: the time a
   step takes with and without them.
3. With `--real-job`: a real job, train/ddp.py under torchrun (2 ranks, gloo), with the hook as a launch installs it
   and without, in pairs whose order alternates (a fixed order measured the machine's drift, not the hook): the
   median of the pairs' ratios.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

from launcher.node import hook, limits, stacks

STEPS = 20000
ROUNDS = 5
TORCH_STEPS = 500
TORCH_ROUNDS = 30
LOOP = """
import json, sys, time
import torch
from torch.optim import optimizer
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.dataloader import _BaseDataLoaderIter

model = torch.nn.Linear(4, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loader = DataLoader(TensorDataset(torch.randn(STEPS, 4)), batch_size=1)
hooked = (torch.Tensor.backward, _BaseDataLoaderIter.__next__, dict(optimizer._global_optimizer_post_hooks))
plain = (torch.Tensor.backward.__wrapped__, _BaseDataLoaderIter.__next__.__wrapped__, {})
found = {"plain": [], "hooked": []}
for _ in range(ROUNDS):
    for name, (backward, draw, hooks) in (("plain", plain), ("hooked", hooked)):
        torch.Tensor.backward, _BaseDataLoaderIter.__next__ = backward, draw
        optimizer._global_optimizer_post_hooks.clear()
        optimizer._global_optimizer_post_hooks.update(hooks)
        began = time.perf_counter()
        for (x,) in loader:
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()
        found[name].append((time.perf_counter() - began) / STEPS * 1e6)
print(json.dumps({name: min(values) for name, values in found.items()}))
"""


class Iterator:
    def __next__(self) -> int:
        return 1


class Tensor:
    def backward(self) -> None:
        return None


def one_step(it: Iterator, tensor: Tensor, step) -> None:  # type: ignore[no-untyped-def]
    next(it)
    tensor.backward()
    step()


def hook_alone() -> dict[str, float]:
    """Microseconds a step: the calls unwrapped, and wrapped with the record written."""
    folder = tempfile.mkdtemp(prefix="hook-cost-")
    recorder = hook.Recorder(folder, limits.RECORD_BYTES, limits.RECORD_FLUSH_S, time.monotonic)
    plain_next, plain_backward = Iterator.__next__, Tensor.backward
    it, tensor = Iterator(), Tensor()
    plain, wrapped = [], []
    for _ in range(ROUNDS):
        Iterator.__next__, Tensor.backward = plain_next, plain_backward  # type: ignore[method-assign]
        began = time.perf_counter()
        for _ in range(STEPS):
            one_step(it, tensor, lambda: None)
        plain.append((time.perf_counter() - began) / STEPS * 1e6)
        Iterator.__next__ = hook.wrap_next(recorder, plain_next)  # type: ignore[method-assign]
        Tensor.backward = hook.wrap_backward(recorder, plain_backward)  # type: ignore[method-assign]
        began = time.perf_counter()
        for _ in range(STEPS):
            one_step(it, tensor, recorder.step)
        wrapped.append((time.perf_counter() - began) / STEPS * 1e6)
    assert recorder.on and recorder.steps == STEPS * ROUNDS, recorder.why
    return {"plain_us": min(plain), "hooked_us": min(wrapped), "added_us": min(wrapped) - min(plain)}


def torch_loop() -> dict[str, float]:
    """Microseconds a real step takes in one process with the hook, its patches taken off and put back in turn (the
    fastest of TORCH_ROUNDS rounds each: the machine's other work only adds)."""
    run_dir = tempfile.mkdtemp(prefix="hook-cost-run-")
    env = dict(os.environ, RANK="0", LOCAL_RANK="0")
    stacks.install_hook(run_dir, env)
    source = LOOP.replace("STEPS", str(TORCH_STEPS)).replace("ROUNDS", str(TORCH_ROUNDS))
    done = subprocess.run([sys.executable, "-c", source], env=env, capture_output=True, text=True, check=True)
    found = json.loads(done.stdout)
    return {"plain_us": found["plain"], "hooked_us": found["hooked"]}


JOB_PAIRS = 6
JOB = ("train/ddp.py", "--epochs", "3", "--dataset-size", "8192", "--log-every", "0")


def _job_s(with_hook: bool) -> float:
    """Seconds train/ddp.py takes under torchrun on 2 ranks here, with the hook (stacks and progress) or without."""
    from bench.common import REPO

    env = dict(os.environ)
    if with_hook:
        stacks.install_hook(tempfile.mkdtemp(prefix="hook-cost-job-"), env)
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", *JOB]
    began = time.perf_counter()
    subprocess.run(argv, cwd=REPO, env=env, capture_output=True, check=True, timeout=600)
    return time.perf_counter() - began


def real_job() -> dict[str, float]:
    """The hook's cost on a real job: JOB_PAIRS pairs, hooked first in every other pair; the median ratio."""
    import statistics

    ratios, walls = [], {"hooked": [], "plain": []}
    for pair in range(JOB_PAIRS):
        order = (True, False) if pair % 2 == 0 else (False, True)
        took = {flag: _job_s(flag) for flag in order}
        walls["hooked"].append(took[True])
        walls["plain"].append(took[False])
        ratios.append(took[True] / took[False])
    return {"ratio": statistics.median(ratios), "hooked_s": statistics.median(walls["hooked"]),
            "plain_s": statistics.median(walls["plain"]), "pairs": JOB_PAIRS}


def main() -> int:
    if "--real-job" in sys.argv[1:]:
        job = real_job()
        print(f"train/ddp.py, 2 ranks, {job['pairs']} pairs in alternating order: {job['hooked_s']:.2f} s with the "
              f"hook, {job['plain_s']:.2f} s without (medians); the pairs' median ratio {job['ratio']:.3f}x")
        return 0
    alone = hook_alone()
    print(f"hook alone: {alone['plain_us']:.2f} us a step unwrapped, {alone['hooked_us']:.2f} us wrapped and "
          f"recorded: +{alone['added_us']:.2f} us a step")
    real = torch_loop()
    print(f"tiny torch step (fastest of {TORCH_ROUNDS} rounds x {TORCH_STEPS} steps, in turn): "
          f"{real['plain_us']:.1f} us without the hook's patches, {real['hooked_us']:.1f} us with them: "
          f"{real['hooked_us'] - real['plain_us']:+.1f} us a step")
    return 0


if __name__ == "__main__":
    sys.exit(main())
