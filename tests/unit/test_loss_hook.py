"""Each rank's training loss as the workers' hook (launcher/node/worker/hook.py) reads it, under real torch on CPU:
small programs run with the hook as their sitecustomize, printing each step's loss; the record must say the same.
One process runs the plain loops in turn (torch takes seconds to import), snapshotting its record after each; the
trainers (Lightning, Hugging Face's Trainer) run once each, as one rank, in the trainers' venv."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from devtools.observe import free_port
from launcher.node.agent import stackdump
from launcher.node.agent.records import parse_record
from launcher.node.worker import hook

REPO = Path(__file__).resolve().parents[2]

PROGRAM = textwrap.dedent('''
    import json, os, sys
    import torch
    import torch.nn.functional as F

    recorder = sys.modules["_ddp_launcher_hook"].recorder
    torch.manual_seed(0)
    x, y = torch.randn(16, 4), torch.randn(16, 1)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    steps = 0

    def printed(name, value):
        print("loss", name, steps, repr(value), flush=True)

    def snapshot(name):
        recorder.write(recorder.clock())
        with open(os.path.join(recorder.folder, str(os.getpid())), "rb") as handle:
            print("record", name, json.dumps(handle.read().decode()), flush=True)

    def stepped():
        global steps
        opt.step()
        opt.zero_grad()
        steps += 1

    for _ in range(5):  # a plain loop
        loss = F.mse_loss(model(x), y)
        loss.backward()
        stepped()
        printed("plain", loss.item())
    snapshot("plain")

    for _ in range(3):  # 4 micro-batches a step, each loss divided by 4: what the loop prints is their mean
        total = 0.0
        for xs, ys in zip(x.chunk(4), y.chunk(4)):
            loss = F.mse_loss(model(xs), ys) / 4
            loss.backward()
            total += loss.item()
        stepped()
        printed("accumulated", total)
    snapshot("accumulated")

    scaler = torch.amp.GradScaler("cpu")
    for i in range(6):  # AMP on CPU: bf16 autocast, the loss scaled; the 4th's inf makes the scaler skip its step
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = F.mse_loss(model(x).float(), y)
        if i == 3:
            loss = loss * float("inf")
        scaler.scale(loss).backward()
        before = scaler.get_scale()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        if scaler.get_scale() < before:
            print("skipped", i, flush=True)
        else:
            steps += 1
            printed("scaled", loss.item())
    snapshot("scaled")

    out = model(x)
    out.backward(torch.ones_like(out))  # a gradient given: the step's loss is not the tensor's
    stepped()
    snapshot("grad")

    for i in range(4):  # no scaler: the loss goes nan at its 3rd step (and stays nan: the weights are)
        loss = F.mse_loss(model(x), y) * (float("nan") if i == 2 else 1.0)
        loss.backward()
        stepped()
        printed("nan", loss.item())
    snapshot("nan")
''')


def hooked_env(run_dir: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "PYTHONPATH")}
    env.update({"RANK": "0", "LOCAL_RANK": "0", **extra})
    stackdump.install_hook(str(run_dir), env)
    return env


def record(text: str) -> dict:
    found = parse_record(text.encode())
    assert found is not None and len(text) == stackdump.bounds.RECORD_BYTES, text
    return found


@pytest.fixture(scope="module")
def program(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, list[tuple[int, float]]], dict[str, dict]]:
    """The program's printed losses by part ([(step, value)]) and its record after each part."""
    tmp = tmp_path_factory.mktemp("loss")
    (tmp / "job.py").write_text(PROGRAM)
    done = subprocess.run([sys.executable, str(tmp / "job.py")], env=hooked_env(tmp / "run"), capture_output=True,
                          text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    losses: dict[str, list[tuple[int, float]]] = {}
    records: dict[str, dict] = {}
    for line in done.stdout.splitlines():
        words = line.split(None, 2)
        if words[0] == "loss":
            name, step, value = line.split()[1:]
            losses.setdefault(name, []).append((int(step), float(value)))
        elif words[0] == "record":
            records[words[1]] = record(json.loads(words[2]))
    return losses, records


def test_a_plain_loops_record_has_its_printed_loss_and_the_sum_of_its_steps(program) -> None:
    losses, records = program
    found = records["plain"]
    assert found["on"] and found["loss_state"] == "on" and found["why"] == ""
    assert (found["loss_step"], found["loss_n"], found["bad_step"], found["skipped"]) == (5, 5, 0, 0)
    assert found["loss"] == pytest.approx(losses["plain"][-1][1], rel=1e-5)  # %.6g
    assert found["loss_sum"] == pytest.approx(sum(v for _, v in losses["plain"]), rel=1e-12)  # exact: %r


def test_gradient_accumulation_reads_the_sum_of_the_micro_batches_losses_the_mean_the_loop_prints(program) -> None:
    losses, records = program
    found, before = records["accumulated"], records["plain"]
    assert found["loss_step"] == 8 and found["loss_n"] == 8
    assert found["loss"] == pytest.approx(losses["accumulated"][-1][1], rel=1e-5)
    window = (found["loss_sum"] - before["loss_sum"]) / (found["loss_n"] - before["loss_n"])  # a window's mean
    assert window == pytest.approx(sum(v for _, v in losses["accumulated"]) / 3, rel=1e-6)


def test_gradscaler_values_are_the_unscaled_loss_and_a_step_it_skipped_is_counted_not_bad(program) -> None:
    losses, records = program
    found, before = records["scaled"], records["accumulated"]
    assert [s for s, _ in losses["scaled"]] == [9, 10, 11, 12, 13]  # the 4th skipped: no optimizer step
    assert found["skipped"] == 1 and found["bad_step"] == 0 and found["loss_state"] == "on"
    assert found["loss_step"] == 13 and found["loss"] == pytest.approx(losses["scaled"][-1][1], rel=1e-5)
    assert found["loss_n"] - before["loss_n"] == 5
    assert found["loss_sum"] - before["loss_sum"] == pytest.approx(sum(v for _, v in losses["scaled"]), rel=1e-9)


def test_a_backward_with_a_gradient_gives_no_value_and_the_record_says_why(program) -> None:
    _, records = program
    found = records["grad"]
    assert found["loss_state"] == "grad" and found["why"] == "backward with a gradient"
    assert found["steps"] == 14 and found["loss_step"] == 13 and found["on"]  # the last value read stays the last


def test_a_loss_that_goes_nan_names_its_step_and_the_last_finite_value_before_it(program) -> None:
    losses, records = program
    found = records["nan"]
    (good_step, good), (bad_step, bad) = losses["nan"][1], losses["nan"][2]
    assert math.isnan(bad) and not math.isnan(good)
    assert found["bad_step"] == bad_step == 17 and math.isnan(found["bad"])
    assert found["good_step"] == good_step == 16 and found["good"] == pytest.approx(good, rel=1e-5)
    assert found["loss_step"] == 18 and math.isnan(found["loss"]) and found["loss_state"] == "on"
    assert found["loss_n"] == records["grad"]["loss_n"] + 2  # the finite ones only


def _trainer_loss(tmp_path: Path, script: str, **knobs: str) -> None:
    """`script` as one rank under the hook in the trainers' venv: the record's last loss is the last one it printed
    (Lightning's, through the launcher, the page and `report --json`: tests/integration/test_trainers.py)."""
    from tests.support.nodeenv import trainers_env

    env = hooked_env(tmp_path / "run", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", GROUP_RANK="0", MASTER_ADDR="127.0.0.1",
                     MASTER_PORT=str(free_port()), TORCHELASTIC_RUN_ID="loss", LOSS_LINES="1", **knobs)
    done = subprocess.run([str(trainers_env().python), script], env=env, cwd=REPO, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    printed = [line.split() for line in done.stdout.splitlines() if line.startswith("loss rank 0 ")]
    assert len(printed) == 20, done.stdout[-2000:]
    folder = tmp_path / "run" / hook.PROGRESS_DIR
    found = [r for r in (parse_record(p.read_bytes()) for p in folder.iterdir()) if r and r["loss_step"]]
    assert len(found) == 1, found  # the rank's own (a helper process reads no loss)
    last = found[0]
    assert last["loss_state"] == "on" and last["loss_step"] == last["steps"] == int(printed[-1][4])
    assert last["loss"] == pytest.approx(float(printed[-1][6]), rel=1e-4)
    assert last["loss_n"] == 20 and last["bad_step"] == 0


@pytest.mark.integration
def test_hugging_face_trainers_loss_is_read_as_each_step_prints_it(tmp_path: Path) -> None:
    _trainer_loss(tmp_path, "tests/scripts/hf_trainer.py", HF_STEPS="20")
