"""`ddpl init`: a commented inventory for a new cluster, from what its nodes say over SSH (the interpreter that has
torch, the GPUs), written where the project's settings look for it, never over a file that is there."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import IO, Any

from launcher.config.inventory import cluster_from_data
from launcher.config.model import Cluster
from launcher.config.starter import IMAGE_PYTHON, Found, render_inventory
from launcher.errors import LauncherError, NodeFailure, UsageError
from launcher.limits import INIT_PYTHON_WAIT_S, INIT_SMI_WAIT_S, INIT_WAIT_S
from launcher.options import DEFAULT_MASTER_PORT
from launcher.paths import relative, task_call
from launcher.run.run_io import RunIO
from launcher.settings import Settings
from launcher.transport.connections import close_all, connect_all, run_all
from launcher.transport.program import node_program, program_input, python_command

PYTHONS = (
    "python3",
    "~/venv/bin/python",
    "~/.venv/bin/python",
    "~/venvs/*/bin/python",
    "~/miniconda3/bin/python",
    "~/miniconda3/envs/*/bin/python",
    "~/anaconda3/bin/python",
    "~/anaconda3/envs/*/bin/python",
    "~/miniforge3/bin/python",
    "~/miniforge3/envs/*/bin/python",
    "/opt/conda/bin/python",
    "/opt/conda/envs/*/bin/python",
)
"""Where a node's interpreter with torch usually is, tried in this order after the project's own venv in the
workdir: the login's python3, a venv in the home, conda's (Miniconda, Anaconda, Miniforge, a container's)."""


def nodes_cluster(names: Sequence[str], ssh_config: str | None) -> Cluster:
    """The nodes `--hosts` names, checked as an inventory's hosts are (a bad name is one sentence)."""
    data: dict[str, Any] = {"hosts": list(names), **({"ssh_config": ssh_config} if ssh_config else {})}
    return cluster_from_data(data, "--hosts")


def _found(name: str, answer: Mapping[str, Any], image: str | None = None) -> Found:
    python, home = answer.get("python"), str(answer.get("home") or "")
    if python and home and python.startswith(home.rstrip("/") + "/"):
        python = "~/" + python[len(home.rstrip("/")) + 1 :]  # the same path on every node of the same user
    notes = []
    if image is not None:  # the job's python is the image's: what the node needs is a runtime
        if not answer.get("runtime"):
            notes.append(f"no podman or docker on PATH, which runs {image} (install podman there)")
    elif not python:
        tried = "; ".join(f"{t['python']}: {t['why']}" for t in answer.get("tried", [])) or "none there"
        notes.append(f"no interpreter with torch (tried {tried})")
    if answer.get("gpu_problem"):
        notes.append(str(answer["gpu_problem"]))
    return Found(name, python or None, int(answer.get("gpus") or 0), answer.get("cpus"), tuple(notes))


def seek(cluster: Cluster, workdir: str, settings: Settings, image: str | None = None) -> list[Found]:
    """Ask every node at once which interpreter has torch (with `image`: which container runtime it has instead) and
    how many GPUs it has (launcher/node/probe/seek.py, run by the login's python3); a node that cannot say is a
    `Found` with a note of why."""
    pythons = [f"{workdir.rstrip('/')}/.venv/bin/python", f"{workdir.rstrip('/')}/venv/bin/python", *PYTHONS]
    request: dict[str, Any] = {
        "pythons": [] if image else pythons,
        "python_wait_s": INIT_PYTHON_WAIT_S,
        "smi_wait_s": INIT_SMI_WAIT_S,
    }
    if image:
        request["container"] = {"runtime": "auto"}
    nodes, failures = connect_all(cluster, cluster.hosts, settings.ssh)
    try:
        results = run_all(
            list(nodes.values()),
            python_command("python3"),
            program_input(node_program("probe.seek"), request),
            INIT_WAIT_S,
        )
    finally:
        close_all(nodes.values())
    found = {f.host: Found(f.host, notes=(f"unreachable: {f}",)) for f in failures}
    for name, result in results.items():
        if isinstance(result, NodeFailure):
            found[name] = Found(name, notes=(f"no answer: {result}",))
            continue
        try:
            found[name] = _found(name, json.loads(result.stdout.decode().strip().splitlines()[-1]), image)
        except (ValueError, IndexError, TypeError, AttributeError):
            lines = result.stderr.decode("utf-8", "replace").strip().splitlines()
            why = lines[-1][:200] if lines else f"exit code {result.exit_code}"
            found[name] = Found(name, notes=(f"python3 there gave no answer ({why})",))
    return [found[h.name] for h in cluster.hosts]


def write_example(output: Path, command: str) -> None:
    """Write the reference inventory (every key, what it does, its default: launcher/config/example.yaml, shipped
    with the package) at `output`, never over a file that is there."""
    if output.exists():
        raise UsageError(
            f"{relative(output)} is there already: `{command}init` never writes over a file (give --output another one)"
        )
    text = (resources.files("launcher.config") / "example.yaml").read_text(encoding="utf-8")
    output.parent.mkdir(parents=True, exist_ok=True)
    with open(output, "x", encoding="utf-8") as file:
        file.write(text)


def no_python(found: Sequence[Found], command: str) -> str:
    """Why `init` wrote nothing: no node said which python has torch (each node's notes), and what to give."""
    why = "; ".join(f"{f.name}: {', '.join(f.notes) or 'no interpreter with torch'}" for f in found)
    return (
        f"no python with torch was found on any node ({why}); nothing was written: give the interpreter that has "
        f"torch on the nodes (`{command}init --python ~/venvs/train/bin/python ...`), or install torch there"
    )


def write_inventory(
    names: Sequence[str],
    output: Path,
    *,
    workdir: str,
    job: Mapping[str, Any],
    master_port: int,
    python: str | None = None,
    nproc_per_node: int | None = None,
    ssh_config: str | None = None,
    settings: Settings,
    err: IO[str],
    command: str,
    image: str | None = None,
) -> list[Found]:
    """Write the inventory for `names` to `output` (never over a file that is there): what every node said, or what
    the command line gave (`python`, `nproc_per_node`: nothing asked of the nodes for it). Nothing is written where
    no node has a python with torch (a LauncherError that asks for --python); with `image` the python is the
    image's (`python` as given, else IMAGE_PYTHON) and the nodes need only a runtime and their own python3."""
    if output.exists():
        raise UsageError(
            f"{relative(output)} is there already: `{command}init` never writes over an inventory "
            "(edit it, or give --output another file)"
        )
    cluster = nodes_cluster(names, ssh_config)
    if python is None or nproc_per_node is None:
        what = "container runtime" if image else "python with torch"
        err.write(f"asking {len(names)} node(s) for their {what} and their GPUs\n")
        found = seek(cluster, workdir, settings, image)
    else:
        found = [Found(h.name) for h in cluster.hosts]
    python = python or (IMAGE_PYTHON if image else None)
    found = [
        Found(f.name, python or f.python, f.gpus, f.cpus, f.notes if python is None or image else (), nproc_per_node)
        for f in found
    ]
    if all(f.python is None for f in found):
        raise LauncherError(no_python(found, command))
    text = render_inventory(
        found, workdir=workdir, job=job, master_port=master_port, ssh_config=ssh_config, command=command, image=image
    )
    output.parent.mkdir(parents=True, exist_ok=True)
    with open(output, "x", encoding="utf-8") as file:  # "x": a file made meanwhile is not overwritten either
        file.write(text)
    return found


def init(
    names: list[str],
    output: Path,
    *,
    workdir: str,
    script: str,
    master_port: int = DEFAULT_MASTER_PORT,
    python: str | None = None,
    nproc_per_node: int | None = None,
    ssh_config: str | None = None,
    doctor_too: bool = True,
    default_output: bool = True,
    settings: Settings | None = None,
    run_io: RunIO | None = None,
    image: str | None = None,
) -> int:
    """Write a commented inventory for the nodes `names` from what they say over SSH (their python with torch, their
    GPUs), then run the doctor on it and say the next command. 0 once the inventory is written (the doctor's
    findings are its advice), 1 when a node's python is still to be set in it; a file at `output` is never
    overwritten, and none is written when no node has a python with torch. `image`: the job runs in this container
    image on every node (`container: {image: ...}` in defaults; the python is the image's)."""
    settings, run_io = settings or Settings(), run_io or RunIO()
    name = task_call("")  # `ddpl `, `inv `, `inv ddp.`: what comes before a task's name
    found = write_inventory(
        names,
        output,
        workdir=workdir,
        job={"script": script, "args": []},
        master_port=master_port,
        python=python,
        nproc_per_node=nproc_per_node,
        ssh_config=ssh_config,
        settings=settings,
        err=run_io.err,
        command=name,
        image=image,
    )
    unknown = _said_written(found, output, run_io)
    hosts = "" if default_output else f" --hosts {relative(output)}"
    from launcher.app.checks import doctor  # the doctor's findings on the nodes just written down

    code = doctor(str(output), settings=settings, run_io=run_io) if doctor_too else 0
    if code:
        run_io.out.write(
            f"the doctor found problems (above): fix them in {relative(output)} or on the nodes; a "
            f"missing {script} is what --sync copies. Then: {name}doctor{hosts}\n"
        )
    run_io.out.write(
        f"next: {name}launch{hosts} --dry-run, then {name}launch{hosts} --sync{' --pull' if image else ''} (this "
        f"project to every workdir{', the image to every node' if image else ''} first)\n"
    )
    return 1 if unknown else 0


def _said_written(found: Sequence[Found], output: Path, run_io: RunIO) -> list[str]:
    """The line that says what was written, and which nodes' python is still to be set (also said)."""
    run_io.out.write(
        f"wrote {relative(output)}: {len(found)} node(s), "
        + ", ".join(f"{f.name} {f.python or 'python3 (no torch found)'} x{f.nproc}" for f in found)
        + "\n"
    )
    unknown = [f.name for f in found if f.python is None]
    if unknown:
        run_io.err.write(
            f"no python with torch was found on {', '.join(unknown)}: set `python:` for "
            f"{'it' if len(unknown) == 1 else 'them'} in {relative(output)}, or install torch there\n"
        )
    return unknown


def init_example(output: Path, *, run_io: RunIO | None = None) -> int:
    """Write the reference inventory at `output` (every key, what it does and its default), never over a file; no
    node is asked."""
    run_io, name = run_io or RunIO(), task_call("")
    write_example(output, name)
    run_io.out.write(
        f"wrote {relative(output)}: every key of an inventory, what it does and its default; copy the "
        f"lines you need into yours (`{name}init --hosts gpu01,gpu02` writes one from what your nodes "
        "say)\n"
    )
    return 0
