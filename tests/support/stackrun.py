"""A worker started as the agent starts one (the stack hook on its PYTHONPATH, the run's mark, RANK), then every
stack taken as the agent takes them, printed as JSON. Stdlib and the launcher's stdlib-only modules: it runs under
any user's Python (`python3 -m tests.support.stackrun RUN_DIR SCRIPT [USER_SITE]` from the repository)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from launcher.limits import NODE_TIMING
from launcher.node import wire
from launcher.node.agent import stackdump


def main() -> None:
    run_dir, script = sys.argv[1], sys.argv[2]
    wire.use_timing({"timing": NODE_TIMING}, wire.AGENT_TIMING)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update({wire.RUN_ID_ENV: "20000101-000000-abcdef/node-0", "RANK": "5", "LOCAL_RANK": "1"})
    if len(sys.argv) > 3:
        env["PYTHONPATH"] = sys.argv[3]  # the node's own site folder, with its own sitecustomize
    stackdump.install_hook(run_dir, env)
    worker = subprocess.Popen([sys.executable, script], env=env)
    try:
        hook = os.path.join(run_dir, stackdump.STACKS_DIR, f"{worker.pid}.txt")
        deadline = time.monotonic() + 30
        while not os.path.exists(hook) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # the script reaches its sleep
        print(json.dumps({"uid": os.getuid(), "workers": stackdump.collect(run_dir, env[wire.RUN_ID_ENV], 5.0)}))
    finally:
        worker.kill()
        worker.wait()


if __name__ == "__main__":
    main()
