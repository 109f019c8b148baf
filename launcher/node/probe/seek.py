"""`ddpl init`'s look at a new node (stdlib only, Python 3.8+): which interpreter there has torch, how many GPUs
nvidia-smi lists, how many CPUs there are; for `init --image`, its container runtime instead of a python (the job's
python is then the image's: the request names no interpreter to try).

It runs under the login's `python3`; the request (one JSON line on stdin) gives the interpreters to try, in order
(`~` is the node's home, `*` a glob: conda's envs), and every wait. Each is asked whether it finds torch, never made
to import it (a CUDA torch takes seconds). One JSON line answers: the first that has torch, what each tried gave.
"""

import glob
import json
import os
import shutil
import subprocess
import sys

from launcher.node.common.containers import runtime_path

FINDS_TORCH = "import importlib.util,sys;print(sys.executable if importlib.util.find_spec('torch') else '')"


def candidates(patterns):
    """The interpreters to try, in the request's order, each once: `python3` is this one (the login's)."""
    seen, found = set(), []
    for pattern in patterns:
        paths = [sys.executable] if pattern == "python3" else sorted(glob.glob(os.path.expanduser(pattern)))
        for path in paths:  # a venv's python links to its base's: the same file, another interpreter
            if os.path.abspath(path) not in seen and os.access(path, os.X_OK):
                seen.add(os.path.abspath(path))
                found.append(path)
    return found


def torch_of(python, wait_s):
    """(the interpreter as it names itself, None) when it finds torch; (None, why not) otherwise."""
    try:
        done = subprocess.run(
            [python, "-c", FINDS_TORCH], stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=wait_s
        )
    except subprocess.TimeoutExpired:
        return None, "no answer in %g s" % wait_s
    except OSError as exc:
        return None, str(exc)
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines()
        return None, lines[-1] if lines else "exit code %s" % done.returncode
    return (done.stdout.strip() or None), (None if done.stdout.strip() else "no torch")


def gpu_count(wait_s):
    """GPUs nvidia-smi lists (0 without nvidia-smi or when it fails: the node is then a CPU node to the job)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return 0, None
    try:
        done = subprocess.run([smi, "-L"], stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=wait_s)
    except (OSError, subprocess.SubprocessError) as exc:
        return 0, "nvidia-smi: %s" % exc
    if done.returncode != 0:
        return 0, "nvidia-smi exited with code %s" % done.returncode
    return len([line for line in done.stdout.splitlines() if line.startswith("GPU ")]), None


def seek(request):
    tried, python = [], None
    for path in candidates(request["pythons"]):
        found, why = torch_of(path, request["python_wait_s"])
        tried.append({"python": path, "torch": found is not None, "why": why})
        if found is not None:
            python = path
            break
    gpus, gpu_problem = gpu_count(request["smi_wait_s"])
    answer = {
        "python": python,
        "tried": tried,
        "gpus": gpus,
        "gpu_problem": gpu_problem,
        "cpus": os.cpu_count(),
        "home": os.path.expanduser("~"),
    }
    if request.get("container") is not None:  # init --image: which runtime would run it here
        answer["runtime"] = runtime_path(request["container"])
    return answer


def main():
    request = json.loads(sys.stdin.readline())
    sys.stdout.write(json.dumps(seek(request)) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
