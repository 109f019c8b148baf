"""The workers' hook (launcher/node/worker/hook.py) as a worker runs it, against a stand-in for torch that has the
names the hook touches (a real torch takes seconds to import: tests/unit/test_loss_hook.py and the integration tests
use it): what it records, that the program sees its modules, methods and pickles as without it, forked children,
recording turned off by a failure while the program goes on, and the loss's paths a real torch on CPU cannot show
(a backward on several elements, a device it does not read, a failure while reading it)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from launcher.node.agent import stackdump
from launcher.node.agent.records import parse_record
from launcher.node.worker import hook

FAKE_TORCH = {
    "torch/__init__.py": "from torch import _tensor, optim\nfrom torch.utils import data\nTensor = _tensor.Tensor\n",
    "torch/_tensor.py": textwrap.dedent('''
        class Device:
            def __init__(self, type):
                self.type = type

        class Tensor:
            def __init__(self, value=1.5, n=1, device="cpu"):
                self.value, self.n, self.device, self.is_cpu = value, n, Device(device), device == "cpu"

            def backward(self, gradient=None):
                """Computes the gradient."""
                return "grads"

            def numel(self):
                return self.n

            def detach(self):
                return self

            def float(self):
                return self

            def reshape(self, shape):
                return self

            def __add__(self, other):
                return Tensor(self.value + other.value, self.n, self.device.type)

            def __float__(self):
                return float(self.value)

            def item(self):
                return float(self.value)
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
    # Two backwards of a one-element tensor a step: its loss is their sum (each 1.5).
    assert (record["loss_state"], record["loss_step"], record["loss"]) == ("on", 5, 3.0)
    assert (record["loss_sum"], record["loss_n"], record["bad_step"], record["skipped"]) == (15.0, 5, 0, 0)
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


@pytest.mark.parametrize(
    ("backward", "state", "why"),
    [
        ("torch.Tensor().backward(torch.Tensor())", "grad", "backward with a gradient"),
        ("torch.Tensor().backward(gradient=torch.Tensor())", "grad", "backward with a gradient"),
        ("torch.Tensor(n=3).backward()", "grad", "backward on 3 elements"),
        ("torch.Tensor(device='xla').backward()", "device", "loss on xla not read"),
        ("torch.Tensor(value=None).backward()", "off", "loss: TypeError: float() argument must be"),
    ],
)
def test_a_loss_it_does_not_read_has_no_value_and_the_record_says_why_while_the_rest_is_recorded(
        tmp_path: Path, backward: str, state: str, why: str) -> None:
    after = textwrap.dedent(f'''
        {backward}
        opt.step()
        print(json.dumps({{"pid": os.getpid()}}))
    ''')
    seen, folder = run_job(tmp_path, after=after)
    record = record_of(folder, seen["pid"])
    assert record["on"] and record["steps"] == 6 and record["batches"] == 5  # recording goes on
    assert record["loss_state"] == state and record["why"].startswith(why), record
    assert record["loss_step"] == 5 and record["loss_n"] == 5  # the loop's values; none for the last step


def test_a_record_is_one_fixed_size_line_and_a_partial_one_is_no_record() -> None:
    recorder = hook.Recorder("/nonexistent", 64, 0.1, lambda: 5.0)
    recorder.off(ValueError("a reason\nover lines " + "x" * 100))
    assert recorder.why.startswith(b"ValueError: a reason over lines x")
    line = (b"p2 42 on 10.500 7 10.400 9 10.450 1.2500 0.5000 6 nan 12.25 5 6 nan 5 2.5 1 on " + b" " * 20
            + b"\n")
    parsed = parse_record(line)
    assert parsed is not None and math.isnan(parsed.pop("loss")) and math.isnan(parsed.pop("bad"))
    assert parsed == {"start": 42, "on": True, "why": "", "t": 10.5, "steps": 7, "t_step": 10.4, "batches": 9,
                      "t_batch": 10.45, "forward_s": 1.25, "data_s": 0.5, "loss_step": 6, "loss_sum": 12.25,
                      "loss_n": 5, "bad_step": 6, "good_step": 5, "good": 2.5, "skipped": 1, "loss_state": "on"}
    assert parse_record(line[:30]) is None and parse_record(b"p1" + line[2:]) is None
    off = parse_record(b"p2 42 off 10.500 7 10.400 9 10.450 1.2500 0.5000 0 nan 0.0 0 0 nan 0 nan 0 none OSError: "
                       b"disk full   \n")
    assert off is not None and not off["on"] and off["why"] == "OSError: disk full" and off["loss_state"] == "none"


def test_the_longest_record_keeps_its_numbers_whole_with_room_for_some_of_why() -> None:
    # Beyond any run: a billion steps, 115 days up, years of forward, the longest floats %.6g and %r write.
    recorder = hook.Recorder("/nonexistent", 256, 0.1, lambda: 5.0)
    recorder.start, recorder.fd = 2**31, -1
    recorder.steps = recorder.batches = recorder.loss_step = recorder.loss_n = recorder.bad_step = 10**9
    recorder.good_step = recorder.skipped = 10**9
    recorder.t_step = recorder.t_batch = 10.0**7
    recorder.forward_s = recorder.data_s = 10.0**8
    recorder.loss, recorder.bad, recorder.good = -1.23456789e-300, -math.inf, -9.87654321e300
    recorder.loss_sum, recorder.loss_state = -1.2345678901234567e-300, b"device"
    written = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(hook.os, "pwrite", lambda fd, data, at: written.append(data))
        recorder.write(10.0**7)
    assert len(written[0]) == 256 and len(written[0].rstrip()) <= 256 - 25, written  # WHY keeps 24 bytes or more
    parsed = parse_record(written[0])
    assert parsed is not None and parsed["loss_sum"] == recorder.loss_sum and parsed["bad"] == -math.inf


class _Device:
    type = "cuda"


class _CudaLoss:
    """A one-element CUDA tensor as the hook touches it: reading its value here would be a sync (it raises)."""

    device = _Device()
    is_cpu = False

    def __init__(self, value: float) -> None:
        self.value = value

    def numel(self) -> int:
        return 1

    def detach(self) -> _CudaLoss:
        return self

    def float(self) -> _CudaLoss:
        return self

    def reshape(self, shape: tuple) -> _CudaLoss:
        return self

    def __add__(self, other: _CudaLoss) -> _CudaLoss:
        return _CudaLoss(self.value + other.value)

    def __float__(self) -> float:
        raise AssertionError("a sync on the step")


class _FakeCuda:
    """torch's names the CUDA path uses: a pinned ring of slots, and events done when the test says."""

    float32 = "float32"

    def __init__(self) -> None:
        self.events: list = []
        self.ring: list = []
        outer = self

        class Event:
            def __init__(self) -> None:
                self.done = False

            def record(self) -> None:
                outer.events.append(self)

            def query(self) -> bool:
                return self.done

        class Slot:
            def __init__(self, index: int) -> None:
                self.index = index

            def copy_(self, source: _CudaLoss, non_blocking: bool = False) -> None:
                assert non_blocking
                outer.ring[self.index] = source.value

            def __float__(self) -> float:
                return outer.ring[self.index]

        class Ring:
            def __getitem__(self, index: int) -> Slot:
                return Slot(index)

        self.cuda = type("cuda", (), {"Event": Event})

        def empty(size: int, dtype: str, pin_memory: bool) -> Ring:
            assert pin_memory and dtype == "float32"
            self.ring = [0.0] * size
            return Ring()

        self.empty = empty


def test_a_cuda_loss_is_copied_at_the_step_and_read_once_its_event_says_it_landed_never_synced(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _FakeCuda()
    monkeypatch.setitem(sys.modules, "torch", fake)
    recorder = hook.Recorder(str(tmp_path), stackdump.bounds.RECORD_BYTES, 100.0, lambda: 5.0,
                             stackdump.bounds.LOSS_RING)
    for value in (2.0, 1.5):
        recorder.backward(_CudaLoss(value / 2))
        recorder.backward(_CudaLoss(value / 2))
        recorder.step()
    assert recorder.loss_step == 0 and len(recorder.pending) == 2  # in flight: nothing read yet
    fake.events[0].done = True
    recorder.write(6.0)
    assert (recorder.loss_step, recorder.loss, recorder.loss_n, recorder.loss_state) == (1, 2.0, 1, b"on")
    fake.events[1].done = True
    recorder.last()  # the end reads what landed
    assert (recorder.loss_step, recorder.loss, recorder.loss_sum) == (2, 1.5, 3.5)
    for step in range(3, 3 + stackdump.bounds.LOSS_RING + 1):  # a ring's worth in flight: the next step gets no value
        recorder.backward(_CudaLoss(float(step)))
        recorder.step()
    assert len(recorder.pending) == stackdump.bounds.LOSS_RING
    for event in fake.events:
        event.done = True
    recorder.write(7.0)
    assert recorder.loss_step == 2 + stackdump.bounds.LOSS_RING and recorder.loss_n == 2 + stackdump.bounds.LOSS_RING
    assert recorder.loss_state == b"on" and parse_record((tmp_path / str(os.getpid())).read_bytes())["loss_n"] == 66

