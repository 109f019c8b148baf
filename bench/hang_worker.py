"""The hang figure's light job: in place of torchrun, one worker per node (RANK = the node's number) that prints two
lines and then sleeps, as a stuck rank does. No torch: 64 nodes start in seconds."""

import os
import subprocess
import sys
import time

if len(sys.argv) > 1 and sys.argv[1] == "worker":
    print("step 0", flush=True)
    print("step 1", flush=True)
    time.sleep(3600)
else:
    node = os.environ.get("DDP_LAUNCHER_RUN", "x/node-0").rsplit("-", 1)[-1]
    env = dict(os.environ, RANK=node, LOCAL_RANK="0", TORCHELASTIC_RESTART_COUNT="0")
    sys.exit(subprocess.call([sys.executable, os.path.abspath(__file__), "worker"], env=env))
