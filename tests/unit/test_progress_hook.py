"""The workers' hook (launcher/node/worker/hook.py) as a worker runs it, against a stand-in for torch that has the four
names the hook touches (a real torch takes seconds to import: the integration tests use it): what it records, that
the program sees its modules, methods and pickles as without it, forked children, and recording turned off by a
failure while the program goes on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from launcher.node.agent import stackdump
from launcher.node.agent.records import parse_record
from launcher.node.worker import hook

FAKE_TORCH = {
    "torch/__init__.py": "from torch import _tensor, optim\nfrom torch.utils import data\nTensor = _tensor.Tensor\n",
    "torch/_tensor.py": textwrap.dedent('''
        class Tensor:
            def backward(self, gradient=None):
                """Computes the gradient."""
                return "grads"
    '''),
    "torch/optim/__init__.py": "from torch.optim import optimizer\n",
    "torch/optim/optimizer.py": textwrap.dedent('''
        _hooks = []

        def register_optimizer_step_post_hook(hook):
            _hooks.append(hook)

        class Optimizer:
            def step(self):
                for hook in _hooks:
                    hook(self, (), {})
    '''),
    "torch/distributed/__init__.py": "from torch.distributed.distributed_c10d import *\n",
    "torch/distributed/distributed_c10d.py": textwrap.dedent('''
        __all__ = ["init_process_group", "destroy_process_group"]

        def init_process_group(backend=None):
            """Joins the group."""
            return "group of " + backend

        def destroy_process_group(group=None):
            """Leaves the group."""
            return "left"
    '''),
    "torch/utils/__init__.py": "",
    "torch/utils/data/__init__.py": "from torch.utils.data import dataloader\n",
    "torch/utils/data/dataloader.py": textwrap.dedent('''
        import time

        class _BaseDataLoaderIter:
            def __init__(self, items, wait):
                self.items, self.wait = list(items), wait

            def __next__(self):
                time.sleep(self.wait)
                if not self.items:
                    raise StopIteration
                return self.items.pop(0)

            def __iter__(self):
                return self
    '''),
}
LOOP = textwrap.dedent('''
    import json, os, pickle, sys, time
    {before}
    import torch
    from torch.optim.optimizer import Optimizer
    from torch.utils.data.dataloader import _BaseDataLoaderIter

    opt, tensor = Optimizer(), torch.Tensor()
    for batch in _BaseDataLoaderIter(range(5), 0.02):
        time.sleep(0.03)  # the forward
        assert tensor.backward() == "grads"
        tensor.backward()  # a second backward of the same batch adds no forward
        opt.step()
    {after}
    same = [pickle.loads(pickle.dumps(f)) is f for f in (torch.Tensor.backward, _BaseDataLoaderIter.__next__)]
    print(json.dumps({{"pid": os.getpid(), "same": same, "loader": type(torch.optim.optimizer.__loader__).__name__,
                      "spec_loader": type(torch.optim.optimizer.__spec__.loader).__name__,
                      "name": torch.Tensor.backward.__name__, "doc": torch.Tensor.backward.__doc__}}))
''')


def run_job(tmp_path: Path, before: str = "", after: str = "", rank: bool = True) -> tuple[dict, Path]:
    for name, source in FAKE_TORCH.items():
        (tmp_path / "fake" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "fake" / name).write_text(source)
    script = tmp_path / "job.py"
    script.write_text(LOOP.format(before=before, after=after))
    run_dir = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "PYTHONPATH")}
    env.update({"PYTHONPATH": str(tmp_path / "fake"), **({"RANK": "0", "LOCAL_RANK": "0"} if rank else {})})
    stackdump.install_hook(str(run_dir), env)
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1]), run_dir / hook.PROGRESS_DIR


def record_of(folder: Path, pid: int) -> dict:
    data = (folder / str(pid)).read_bytes()
    assert len(data) == stackdump.bounds.RECORD_BYTES and data.endswith(b"\n")
    found = parse_record(data)
    assert found is not None, data
    return found


def test_a_worker_records_its_steps_batches_forward_and_data_wait_and_sees_torch_as_without_the_hook(
        tmp_path: Path) -> None:
    seen, folder = run_job(tmp_path)
    record = record_of(folder, seen["pid"])
    assert record["on"] and record["why"] == ""
    assert record["steps"] == 5 and record["batches"] == 5
    assert 5 * 0.03 <= record["forward_s"] < 5 * 0.03 + 0.1  # from each batch's arrival to its first backward
    assert 5 * 0.02 <= record["data_s"] < 5 * 0.02 + 0.1  # the waits for batches (not for the end: no batch)
    assert record["t_step"] >= record["t_batch"] > 0 and record["start"] > 0
    # What the program sees: its modules' own loaders, methods that pickle as themselves, their names and docs.
    assert seen["same"] == [True, True]
    assert seen["loader"] == seen["spec_loader"] == "SourceFileLoader"
    assert seen["name"] == "backward" and seen["doc"] == "Computes the gradient."


def test_no_rank_no_record_and_a_program_without_torch_leaves_none(tmp_path: Path) -> None:
    _, folder = run_job(tmp_path, rank=False)  # torchrun itself imports torch: it has no RANK
    assert list(folder.iterdir()) == []
    plain = tmp_path / "plain.py"
    plain.write_text("import json\nprint(json.dumps({'ok': True}))\n")
    env = {**os.environ, "RANK": "0"}
    stackdump.install_hook(str(tmp_path / "run2"), env)
    assert subprocess.run([sys.executable, str(plain)], env=env, timeout=60).returncode == 0
    assert list((tmp_path / "run2" / hook.PROGRESS_DIR).iterdir()) == []


def test_a_forked_child_keeps_its_own_record_and_never_writes_its_parents(tmp_path: Path) -> None:
    after = textwrap.dedent('''
        child = os.fork()
        if child == 0:
            opt.step()  # the child's own first step: its own file
            os._exit(0)
        os.waitpid(child, 0)
        print(json.dumps({"child": child}))
    ''')
    seen, folder = run_job(tmp_path, after=after)
    assert record_of(folder, seen["pid"])["steps"] == 5  # the parent's, as it was
    child = json.loads(next(p.name for p in folder.iterdir() if p.name != str(seen["pid"])))
    mine = record_of(folder, child)
    assert mine["steps"] == 1 and mine["batches"] == 0 and mine["forward_s"] == 0.0
    assert [p.name for p in (folder.parent / hook.PHASES_DIR).iterdir()] == [str(seen["pid"])]  # a child's: none


def test_a_rank_notes_its_start_once_a_phase_in_order_with_its_rank_and_restart(tmp_path: Path) -> None:
    before = textwrap.dedent('''
        import torch.distributed as dist
        assert dist.init_process_group("gloo") == "group of gloo"
        assert dist.init_process_group.__name__ == "init_process_group" and "Joins" in dist.init_process_group.__doc__
    ''')
    seen, folder = run_job(tmp_path, before=before)
    lines = [line.split() for line in (folder.parent / hook.PHASES_DIR / str(seen["pid"])).read_text().splitlines()]
    # each once: 5 steps, 5 batches
    assert [line[0] for line in lines] == ["hook", "torch", "rdzv", "pg", "batch", "step"]
    times = [float(line[1]) for line in lines]
    assert times == sorted(times) and times[-1] - times[0] < 30
    assert {tuple(line[2:]) for line in lines} == {("0", "0", "0")}  # rank, local rank, restart


def test_a_program_that_ends_with_os_exit_after_destroy_process_group_has_every_step_in_its_record(
        tmp_path: Path) -> None:
    # train/ddp.py's end (gloo's threads outlive the group: no interpreter teardown), so atexit never runs; the
    # record was last written at the first step, the flush interval being longer than the whole loop.
    after = textwrap.dedent('''
        import torch.distributed as dist
        assert dist.destroy_process_group() == "left" and dist.destroy_process_group.__name__ == "destroy_process_group"
        print(json.dumps({"pid": os.getpid()}), flush=True)
        os._exit(0)
    ''')
    seen, folder = run_job(tmp_path, after=after)
    record = record_of(folder, seen["pid"])
    assert record["steps"] == 5 and record["batches"] == 5, record


def test_a_failure_in_the_hooks_patching_turns_recording_off_and_says_why_while_the_program_runs(
        tmp_path: Path) -> None:
    before = textwrap.dedent('''
        def broken(*args):
            raise RuntimeError("patching failed on purpose")

        sys.modules["_ddp_launcher_patches"].wrap_next = broken
    ''')
    seen, folder = run_job(tmp_path, before=before)
    record = record_of(folder, seen["pid"])
    assert not record["on"] and record["why"] == "RuntimeError: patching failed on purpose"
    assert record["steps"] == 0  # once off, nothing more is counted
    assert seen["same"] == [True, True]


def test_a_record_is_one_fixed_size_line_and_a_partial_one_is_no_record() -> None:
    recorder = hook.Recorder("/nonexistent", 64, 0.1, lambda: 5.0)
    recorder.off(ValueError("a reason\nover lines " + "x" * 100))
    assert recorder.why.startswith(b"ValueError: a reason over lines x")
    line = b"p1 42 on 10.500 7 10.400 9 10.450 1.2500 0.5000 " + b" " * 20 + b"\n"
    assert parse_record(line) == {"start": 42, "on": True, "why": "", "t": 10.5, "steps": 7, "t_step": 10.4,
                                  "batches": 9, "t_batch": 10.45, "forward_s": 1.25, "data_s": 0.5}
    assert parse_record(line[:30]) is None and parse_record(b"p9" + line[2:]) is None
    off = parse_record(b"p1 42 off 10.500 7 10.400 9 10.450 1.2500 0.5000 OSError: disk full   \n")
    assert off is not None and not off["on"] and off["why"] == "OSError: disk full"
