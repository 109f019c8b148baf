"""Record real collectives files (launcher/node/worker/collectives.py) of two gloo ranks for the unit tests' data: each
case runs under torchrun with the workers' hook installed, and the files of both ranks are copied at a moment the
case names. Run from the checkout: `.venv/bin/python tests/scripts/record_collectives.py` (CPU, ~1 minute).

- hang: rank 1 sleeps inside its step while rank 0 waits in DDP's gradient all-reduce (copied 8 s into the sleep)
- slow: rank 1 sleeps 0.1 s more than rank 0 every step (copied after 12 s of steps)
- healthy: both ranks alike (copied after 12 s of steps)
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from launcher.limits import COLLECTIVES  # noqa: E402
from launcher.node.agent.stackdump import install_hook  # noqa: E402

TRAIN = '''
import sys, time, torch, torch.distributed as dist
case = sys.argv[1]
dist.init_process_group("gloo")
rank = dist.get_rank()
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 16))
opt = torch.optim.SGD(model.parameters(), 0.1)
began = time.monotonic()
step = 0
while time.monotonic() - began < 40:
    time.sleep(0.05 + (0.1 if case == "slow" and rank == 1 else 0.0))
    if case == "hang" and rank == 1 and step == 40:
        time.sleep(600)
    model(torch.randn(8, 16)).sum().backward()
    opt.step()
    step += 1
'''


def record(case: str, at_s: float, out: Path) -> None:
    with tempfile.TemporaryDirectory() as run_dir:
        env = dict(os.environ, TORCH_FR_BUFFER_SIZE=COLLECTIVES["buffer"])
        install_hook(run_dir, env, True, COLLECTIVES)
        script = Path(run_dir) / "train.py"
        script.write_text(TRAIN)
        torchrun = Path(sys.executable).with_name("torchrun")
        proc = subprocess.Popen([str(torchrun), "--nproc-per-node", "2", "--master-port", "29891", str(script), case],
                                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        folder = Path(run_dir) / "collectives"
        try:
            while len([p for p in folder.iterdir() if p.name.isdigit()]) < 2:
                time.sleep(0.2)
            time.sleep(at_s)
            out.mkdir(parents=True, exist_ok=True)
            for path in (p for p in folder.iterdir() if p.name.isdigit()):
                shutil.copy(path, out / f"rank{json.loads(path.read_text())['rank']}.json")
        finally:
            os.killpg(proc.pid, 9)
            proc.wait()


if __name__ == "__main__":
    data = HERE.parent / "data" / "collectives"
    record("hang", 8 + 40 * 0.05 + 2, data / "hang")
    record("slow", 12, data / "slow")
    record("healthy", 12, data / "healthy")
