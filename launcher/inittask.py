"""The `init` task: a commented inventory for new nodes, written from what they say over SSH (their python with
torch, their GPUs; with --image, their container runtime: the job's python is then the image's), then the doctor on
it; `--example` writes the reference inventory instead. `launcher.tasks` adds it to `ns`."""

from __future__ import annotations

from pathlib import Path

from invoke import Exit

from launcher import app, options
from launcher.errors import USAGE
from launcher.paths import relative
from launcher.project import resolve
from launcher.taskkit import inventory_path, none_given, project_root, reported, task, task_settings


@task(
    help={
        "hosts": "the nodes, comma-separated: gpu01,gpu02 (ssh aliases, DNS names or addresses; the first is node "
        "rank 0)",
        "output": "where to write the inventory (default: the `hosts` setting, hosts/cluster.yaml in the project); "
        "never over a file that is there",
        "workdir": "where your code is on each node (default: ~/ and this project's folder name)",
        "script": "the training script, relative to the workdir (default: train.py)",
        "python": "the interpreter with torch on every node (default: the first that has torch: the project's venv in "
        "the workdir, the login's python3, a venv or conda in the home, /opt/conda); with --image, the image's "
        "(default: python3)",
        "image": "run the job in this container image on every node (`container: {image: ...}` in defaults): the "
        "nodes then need podman or docker and their own python3, torch is the image's",
        "nproc-per-node": "worker processes on each node (default: its GPU count from nvidia-smi, else 1)",
        "ssh-config": "an ssh config file to reach the nodes with, instead of ~/.ssh/config",
        "master-port": "the rendezvous port on the first node",
        "skip-doctor": "write the inventory only; run no doctor on it",
        "connect-timeout": "seconds to wait for each node's SSH connection",
        "example": f"write the reference inventory instead (every key, what it does, its default) to --output "
        f"(default: {options.DEFAULT_EXAMPLE} in the project); no node is asked",
    }
)
@reported
def init(
    c,
    hosts=None,
    output=None,
    workdir=None,
    script="train.py",
    python=None,
    nproc_per_node=None,
    ssh_config=None,
    master_port=options.DEFAULT_MASTER_PORT,
    skip_doctor=False,
    connect_timeout=None,
    example=False,
    image=None,
):
    """Write a commented inventory for new nodes from what they say over SSH; run the doctor; say what is next.

    It asks each node for its python with torch and its GPUs (nproc_per_node), and never writes over a file."""
    if example:
        none_given(
            "--example (no node is asked)",
            hosts=hosts,
            workdir=workdir,
            python=python,
            nproc_per_node=nproc_per_node,
            ssh_config=ssh_config,
            connect_timeout=connect_timeout,
            image=image,
        )
        return app.init_example(
            Path(output) if output else Path(relative(resolve(options.DEFAULT_EXAMPLE, project_root(c))))
        )
    names = [name.strip() for name in (hosts or "").split(",") if name.strip()]
    if not names:
        raise Exit("error: --hosts names no node: give them comma-separated, gpu01,gpu02", USAGE)
    nproc = (
        None
        if nproc_per_node is None
        else options.whole_number("nproc_per_node", nproc_per_node, 1, options.MAX_NPROC_PER_NODE)
    )
    project = project_root(c) or Path.cwd()
    if ssh_config and not ssh_config.startswith("~"):  # the inventory's ssh_config is read from wherever ddpl runs
        ssh_config = str(Path(ssh_config).absolute())
    return app.init(
        names,
        Path(output) if output else inventory_path(c),
        workdir=workdir or f"~/{project.name}",
        script=script,
        master_port=options.whole_number("master_port", master_port, 1, 65535),
        python=python,
        nproc_per_node=nproc,
        ssh_config=ssh_config,
        doctor_too=not skip_doctor,
        default_output=output is None,
        settings=task_settings(c, options.Given(connect_timeout=connect_timeout)),
        image=_image(image),
    )


def _image(image: str | None) -> str | None:
    """`--image` as an image reference (one word, no option), or None."""
    if image is not None and (not image.strip() or image.startswith("-") or any(c.isspace() for c in image)):
        raise Exit(f"error: --image must be an image reference (registry/name:tag), got {image!r}", USAGE)
    return image
