"""What the workers' progress hook (launcher/node/worker/hook.py) costs a training step: `python -m bench.hook_cost`.

1. The hook alone: one step's calls (a batch drawn through the wrapped `__next__`, the wrapped `backward`, the
   optimizer's step post hook writing the record) against the same calls unwrapped, with originals that do
   nothing: the cost the hook adds, in microseconds a step.
2. A real torch loop (a tiny Linear model, SGD, a DataLoader in the process: about 0.2 ms a step, where the hook
   weighs most) in one process under the hook, its patches taken off and put back round after round: the time a
   step takes with and without them, and with them but the loss not read (#68: the loss's own cost, paired).
3. With `--real-job`: a real job, train/ddp.py under torchrun (2 ranks, gloo), without the hook, with the hook as it
   was before the collectives' thread (stacks, progress), and with the whole hook as a launch installs it (its
   thread reading torch's flight recorder, TORCH_FR_BUFFER_SIZE set as on a CPU node), in rounds whose order
   rotates (a fixed order measured the machine's drift, not the hook): each against no hook, the rounds' median.
4. With `--reads`: what one read of the collectives' thread costs inside a worker
   (launcher/node/worker/collectives.py): the groups' status, and a full read of the recorder's entries at its
   buffer's sizes, after as many collectives.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

from launcher.node.agent import stackdump
from launcher.node.common import bounds
from launcher.node.worker import hook, patches

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
recorder = sys.modules["_ddp_launcher_hook"].recorder
found = {"plain": [], "hooked": [], "no_loss": [], "ratio": []}
variants = [("plain", plain), ("hooked", hooked), ("no_loss", hooked)]
for round_ in range(ROUNDS):  # the order turns round by round: none pays for following another
    for name, (backward, draw, hooks) in variants[round_ % 3:] + variants[:round_ % 3]:
        recorder.loss_state = b"off" if name == "no_loss" else b"on"  # the loss not read: the rest as it is
        torch.Tensor.backward, _BaseDataLoaderIter.__next__ = backward, draw
        optimizer._global_optimizer_post_hooks.clear()
        optimizer._global_optimizer_post_hooks.update(hooks)
        began = time.perf_counter()
        for (x,) in loader:
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()
        found[name].append((time.perf_counter() - began) / STEPS * 1e6)
    found["ratio"].append(found["hooked"][-1] / found["no_loss"][-1])
print(json.dumps({**{k: min(v) for k, v in found.items()}, "ratio": sorted(found["ratio"])[ROUNDS // 2]}))
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
    recorder = hook.Recorder(folder, bounds.RECORD_BYTES, bounds.RECORD_FLUSH_S, time.monotonic)
    plain_next, plain_backward = Iterator.__next__, Tensor.backward
    it, tensor = Iterator(), Tensor()
    plain, wrapped = [], []
    for _ in range(ROUNDS):
        Iterator.__next__, Tensor.backward = plain_next, plain_backward  # type: ignore[method-assign]
        began = time.perf_counter()
        for _ in range(STEPS):
            one_step(it, tensor, lambda: None)
        plain.append((time.perf_counter() - began) / STEPS * 1e6)
        Iterator.__next__ = patches.wrap_next(recorder, plain_next)  # type: ignore[method-assign]
        Tensor.backward = patches.wrap_backward(recorder, plain_backward)  # type: ignore[method-assign]
        began = time.perf_counter()
        for _ in range(STEPS):
            one_step(it, tensor, recorder.step)
        wrapped.append((time.perf_counter() - began) / STEPS * 1e6)
    assert recorder.on and recorder.steps == STEPS * ROUNDS, recorder.why
    return {"plain_us": min(plain), "hooked_us": min(wrapped), "added_us": min(wrapped) - min(plain)}


def loss_alone() -> dict[str, float]:
    """Microseconds the loss's read adds to a step: the recorder's backward and step with a real torch loss, reading
    on and off in turn (the fastest of ROUNDS rounds each): what the tiny loop's noise (+-5%) cannot resolve."""
    import torch

    recorder = hook.Recorder(tempfile.mkdtemp(prefix="hook-cost-"), bounds.RECORD_BYTES, bounds.RECORD_FLUSH_S,
                             time.monotonic, bounds.LOSS_RING)
    weight = torch.randn(4, 4, requires_grad=True)
    loss = (weight * 2).sum()
    found: dict[str, list[float]] = {"on": [], "off": []}
    for _ in range(ROUNDS):
        for state in ("on", "off"):
            recorder.loss_state = state.encode()
            began = time.perf_counter()
            for _ in range(STEPS):
                recorder.backward(loss, None)
                recorder.step()
            found[state].append((time.perf_counter() - began) / STEPS * 1e6)
    return {"on_us": min(found["on"]), "off_us": min(found["off"])}


def torch_loop() -> dict[str, float]:
    """Microseconds a real step takes in one process with the hook, its patches taken off and put back in turn (the
    fastest of TORCH_ROUNDS rounds each: the machine's other work only adds)."""
    run_dir = tempfile.mkdtemp(prefix="hook-cost-run-")
    env = dict(os.environ, RANK="0", LOCAL_RANK="0")
    stackdump.install_hook(run_dir, env)
    source = LOOP.replace("STEPS", str(TORCH_STEPS)).replace("ROUNDS", str(TORCH_ROUNDS))
    done = subprocess.run([sys.executable, "-c", source], env=env, capture_output=True, text=True, check=True)
    found = json.loads(done.stdout)
    return {"plain_us": found["plain"], "hooked_us": found["hooked"], "no_loss_us": found["no_loss"],
            "loss_ratio": found["ratio"]}


JOB_PAIRS = 6
JOB = ("train/ddp.py", "--epochs", "3", "--dataset-size", "8192", "--log-every", "0")
MODES = ("plain", "hook", "collectives")


def _job_s(mode: str) -> float:
    """Seconds train/ddp.py takes under torchrun on 2 ranks here: `plain` (no hook), `hook` (stacks and progress),
    `collectives` (the whole hook as a launch installs it on a CPU node)."""
    from bench.common import REPO
    from launcher.limits import COLLECTIVES

    env = dict(os.environ)
    if mode != "plain":
        stackdump.install_hook(tempfile.mkdtemp(prefix="hook-cost-job-"), env, True,
                            COLLECTIVES if mode == "collectives" else None)
    if mode == "collectives":
        env["TORCH_FR_BUFFER_SIZE"] = COLLECTIVES["buffer"]
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", *JOB]
    began = time.perf_counter()
    subprocess.run(argv, cwd=REPO, env=env, capture_output=True, check=True, timeout=600)
    return time.perf_counter() - began


def real_job() -> dict[str, float]:
    """The hook's cost on a real job: JOB_PAIRS rounds of every mode, the order rotating; each mode's median
    seconds, and the median of its rounds' ratios to no hook."""
    import statistics

    walls: dict[str, list[float]] = {mode: [] for mode in MODES}
    ratios: dict[str, list[float]] = {mode: [] for mode in MODES[1:]}
    for round_ in range(JOB_PAIRS):
        order = MODES[round_ % len(MODES):] + MODES[:round_ % len(MODES)]
        took = {mode: _job_s(mode) for mode in order}
        for mode in MODES:
            walls[mode].append(took[mode])
        for mode in MODES[1:]:
            ratios[mode].append(took[mode] / took["plain"])
    found: dict[str, float] = {f"{mode}_s": statistics.median(walls[mode]) for mode in MODES}
    found.update({f"{mode}_ratio": statistics.median(ratios[mode]) for mode in MODES[1:]})
    return {**found, "rounds": JOB_PAIRS}


READS = """
import json, os, sys, time
import torch, torch.distributed as dist
sys.path.insert(0, HOOK_DIR)
import _ddp_launcher_collectives as collectives
dist.init_process_group("gloo")
tensor = torch.ones(1)
for _ in range(COUNT):
    dist.all_reduce(tensor)
watcher = collectives.Watcher(FOLDER, 1.0, 5.0, 200, 100.0, -1)
status, full = [], []
for _ in range(20):
    watcher.next_full = float("inf")
    began = time.perf_counter(); watcher.look(time.monotonic()); status.append(time.perf_counter() - began)
    watcher.next_full = 0.0
    began = time.perf_counter(); watcher.look(time.monotonic()); full.append(time.perf_counter() - began)
    watcher.write(time.monotonic())
if dist.get_rank() == 0:
    print(json.dumps({"status_ms": min(status) * 1e3, "full_ms": min(full) * 1e3, "source": watcher.sources}))
dist.destroy_process_group()
"""


def reads(buffer: int) -> dict[str, float]:
    """One status read and one full read of the collectives' thread, in a gloo rank whose recorder holds `buffer`
    collectives (the fastest of 20 each, in milliseconds)."""
    run_dir = tempfile.mkdtemp(prefix="hook-cost-reads-")
    stackdump.install_hook(run_dir, {}, True)
    source = (READS.replace("HOOK_DIR", repr(os.path.join(run_dir, stackdump.HOOK_DIR))).replace("COUNT", str(buffer))
              .replace("FOLDER", repr(os.path.join(run_dir, hook.COLLECTIVES_DIR))))
    script = os.path.join(run_dir, "reads.py")
    with open(script, "w", encoding="utf-8") as handle:
        handle.write(source)
    env = dict(os.environ, TORCH_FR_BUFFER_SIZE=str(buffer))
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", script]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=True, timeout=300)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    if "--real-job" in sys.argv[1:]:
        job = real_job()
        print(f"train/ddp.py, 2 ranks, {job['rounds']} rounds in rotating order (medians): {job['plain_s']:.2f} s "
              f"without the hook, {job['hook_s']:.2f} s with stacks and progress ({job['hook_ratio']:.3f}x), "
              f"{job['collectives_s']:.2f} s with the collectives' thread too ({job['collectives_ratio']:.3f}x)")
        return 0
    if "--reads" in sys.argv[1:]:
        from launcher.limits import COLLECTIVES

        for buffer in (int(COLLECTIVES["buffer"]), 2000):
            found = reads(buffer)
            every = max(COLLECTIVES["arrivals_s"], COLLECTIVES["cost_factor"] * found["full_ms"] / 1e3)
            print(f"recorder of {buffer} collectives ({' and '.join(found['source'])}): a status read "
                  f"{found['status_ms']:.3f} ms (every {COLLECTIVES['status_s']:g} s: "
                  f"{found['status_ms'] / 10 / COLLECTIVES['status_s']:.3f}% of a worker's time), a full read "
                  f"{found['full_ms']:.2f} ms (every {every:g} s: {found['full_ms'] / 10 / every:.3f}%)")
        return 0
    alone = hook_alone()
    print(f"hook alone: {alone['plain_us']:.2f} us a step unwrapped, {alone['hooked_us']:.2f} us wrapped and "
          f"recorded: +{alone['added_us']:.2f} us a step")
    read = loss_alone()
    print(f"the loss read alone (the recorder's backward and step, a real torch loss): {read['off_us']:.2f} us a step "
          f"off, {read['on_us']:.2f} us on: +{read['on_us'] - read['off_us']:.2f} us a step")
    real = torch_loop()
    print(f"tiny torch step (fastest of {TORCH_ROUNDS} rounds x {TORCH_STEPS} steps, in turn): "
          f"{real['plain_us']:.1f} us without the hook's patches, {real['hooked_us']:.1f} us with them: "
          f"{real['hooked_us'] - real['plain_us']:+.1f} us a step")
    print(f"the loss read (the same rounds, paired): {real['no_loss_us']:.1f} us a step with the hook but no loss "
          f"read, {real['hooked_us']:.1f} us with it: {real['hooked_us'] - real['no_loss_us']:+.1f} us, "
          f"{real['loss_ratio']:.3f}x (the median round's ratio; target <= 1.01x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
