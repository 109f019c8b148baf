"""The hang figure's light job: in place of torchrun, one worker per node (RANK = the node's number) that prints two
lines and then waits in a collective that never ends (a stand-in for torch's all_reduce, in a file where torch's is:
the launcher's verdict needs a rank waiting for its peers), as a stuck rank does; or (`steady S`) prints a step
every 0.2 s for S seconds, as a healthy rank does. No torch: 64 nodes start in seconds."""

import importlib.util
import os
import subprocess
import sys
import time

STAND_IN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "stand_in", "torch", "distributed",
                        "distributed_c10d.py")

if len(sys.argv) > 2 and sys.argv[1] == "worker" and sys.argv[2] != "-":
    for step in range(int(float(sys.argv[2]) / 0.2)):
        print(f"step {step}", flush=True)
        time.sleep(0.2)
elif len(sys.argv) > 1 and sys.argv[1] == "worker":
    print("step 0", flush=True)
    print("step 1", flush=True)
    spec = importlib.util.spec_from_file_location("distributed_c10d", STAND_IN)
    collective = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(collective)
    collective.all_reduce(3600)
else:
    node = os.environ.get("DDP_LAUNCHER_RUN", "x/node-0").rsplit("-", 1)[-1]
    env = dict(os.environ, RANK=node, LOCAL_RANK="0", TORCHELASTIC_RESTART_COUNT="0")
    steady = sys.argv[2] if len(sys.argv) > 2 and sys.argv[1] == "steady" else "-"
    sys.exit(subprocess.call([sys.executable, os.path.abspath(__file__), "worker", steady], env=env))
