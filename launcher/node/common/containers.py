"""A node's container runtime and the words of its `run` (stdlib only, Python 3.8+): what the agent starts a run's
container with and what the probe looks into the image with, one set of flags for both.

Every container the launcher starts shares the node's network (the rendezvous and NCCL reach the other nodes as a
bare run does), its IPC namespace (NCCL's shared memory between local ranks) and its pids (`--pid host`: the hook's
records, stacks by pid, `top`'s /proc and a stop's pid and start time checks need no translation). The workdir,
the run's folder and the user's mounts are bind-mounted at the same paths. GPUs go in the runtime's own way: CDI
devices for podman (`--gpus` is accepted and ignored by podman 4), `--gpus all` for docker; `--include`'s choice
stays CUDA_VISIBLE_DEVICES inside, over the same list. docker's daemon runs containers as root unless told: the run
is started as the node's user (`--user UID:GID`), so its processes are the user's, as a bare run's are (podman
without root maps its root to the user already).
"""

import os

from launcher.node.common.child import which
from launcher.node.loader import node_path
from launcher.node.wire import RUN_ID_ENV

RUN_LABEL = "ddpl.run"
NODE_LABEL = "ddpl.node"
NVIDIA_DEVICE = "/dev/nvidiactl"
"""Present on a node whose NVIDIA driver is loaded: the container gets the GPUs then."""


def runtime_path(spec, path=None):
    """The runtime's program on this node (`runtime: auto`: podman where there is one, else docker), or None."""
    names = ("podman", "docker") if spec.get("runtime", "auto") == "auto" else (spec["runtime"],)
    for name in names:
        found = which(name, os.environ.get("PATH") if path is None else path)
        if found is not None:
            return found
    return None


def runtime_kind(program):
    """docker or podman, from the program's name (a `docker` that is podman's shim answers as docker does)."""
    return "docker" if os.path.basename(program).startswith("docker") else "podman"


def container_name(mark):
    """The run's container on this node: `ddpl-<run id>-<node>`, in the characters runtimes accept."""
    text = "ddpl-" + mark.replace("/", "-")
    return "".join(ch if ch.isascii() and (ch.isalnum() or ch in "_.-") else "_" for ch in text)


def labels(mark):
    run, _, node = mark.partition("/")
    return {RUN_LABEL: run, NODE_LABEL: node}


def mount_words(spec, paths):
    """`-v SRC:DEST[:ro]` for the same-path folders (`paths`: the workdir, the run's folder) and the user's mounts
    (`~` is this node's home); each folder once."""
    seen, words = set(), []
    for written in list(paths) + list(spec.get("mounts", [])):
        parts = written.split(":")
        source = node_path(parts[0])
        dest = node_path(parts[1]) if len(parts) > 1 else source
        mode = (":" + parts[2]) if len(parts) > 2 else ""
        if dest in seen:
            continue
        seen.add(dest)
        words += ["-v", "%s:%s%s" % (source, dest, mode)]
    return words


def gpu_words(kind):
    """The node's GPUs into the container, the runtime's way; nothing on a node without NVIDIA's driver."""
    if not os.path.exists(NVIDIA_DEVICE):
        return []
    return ["--gpus", "all"] if kind == "docker" else ["--device", "nvidia.com/gpu=all"]


def user_words(kind):
    """docker: the node's user inside (the daemon's default is root); podman: its own mapping already."""
    if kind != "docker" or os.geteuid() == 0:
        return []
    return ["--user", "%d:%d" % (os.geteuid(), os.getegid())]


def run_words(program, spec, workdir, paths, name=None, mark=None):
    """`PROGRAM run` with every flag the launcher sets, up to and with the image: the command follows.

    `name` and `mark` for a run's container (its name, labels and the run's mark, which every process inside
    carries from its start); without them an unnamed one (the probe's look into the image).
    """
    kind = runtime_kind(program)
    # --rm: the runtime removes the container at its end, even when its client is gone; the client's exit code is
    # the container's.
    words = [program, "run", "--rm", "-i", "--network", "host", "--ipc", "host", "--pid", "host"]
    words += ["--pull", spec.get("pull", "missing"), "-w", node_path(workdir)]
    if name is not None:
        words += ["--name", name, "--sig-proxy=false"]
        for key, value in sorted(labels(mark).items()):
            words += ["--label", "%s=%s" % (key, value)]
        words += ["--env", "%s=%s" % (RUN_ID_ENV, mark)]
    if kind == "podman":
        # The container's output goes straight to the client's descriptors (the run's files), and keeps going
        # there when the client is gone; docker has no such driver (its start writes into the run's log itself).
        words += ["--log-driver", "passthrough"]
    words += mount_words(spec, paths) + gpu_words(kind) + user_words(kind)
    return words + list(spec.get("options", [])) + [spec["image"]]


def remove_words(program, names):
    """Remove these containers now, whatever their state (their processes were stopped first: no wait)."""
    if runtime_kind(program) == "podman":
        return [program, "rm", "--force", "--time", "0", *list(names)]
    return [program, "rm", "--force", *list(names)]


def listed_words(program, mark):
    """List the ids of every container of this run on this node, whatever its state (by label)."""
    words = [program, "ps", "--all", "--quiet", "--no-trunc"]
    for key, value in sorted(labels(mark).items()):
        words += ["--filter", "label=%s=%s" % (key, value)]
    return words
