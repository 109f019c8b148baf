"""Podman for the tests: a storage root of its own per test (or per sandbox node), a tiny image built here with no
registry (busybox and nothing else: Python and torch come bind-mounted read-only from this machine), the run's
container started the way the launcher will start it, and the runtime's own lookups by label.

Everything podman keeps goes under the root (its containers.conf and storage.conf, images, containers, its runtime
files); what each setting is for and what was measured: docs/containers-findings.md.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import signal
import string
import subprocess
import sys
import tarfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

CONF_TEMPLATE = Path(__file__).parent / "podman_conf" / "containers.conf"
BUSYBOX = Path("/bin/busybox")
"""Debian's busybox-static: one static binary, the image's shell and tools."""
IMAGE_MTIME = 1_000_000_000
"""Every member's mtime and the tarball file's own: `podman import FILE` takes the image's creation time from the
file's mtime, so the same files make the same image id in every storage root (as nodes that pulled one image)."""
RUN_LABEL = "ddpl.run"
NODE_LABEL = "ddpl.node"
STDIN_ENV = "import json,os,sys; os.environ.update(json.load(sys.stdin)); os.execv(sys.argv[1], sys.argv[1:])"
"""The in-container start that takes the secrets from stdin (a JSON object) and execs the command: the values are
then in no command line and in no `podman inspect` (`--env`, `--env-file` and `--secret type=env` all show there)."""
TIMEOUT_S = 60.0


def unavailable() -> str | None:
    """Why the container tests cannot run on this machine (one sentence), or None."""
    missing = [tool for tool in ("podman", "runc") if shutil.which(tool) is None]
    if not BUSYBOX.is_file():
        missing.append("busybox-static")
    if missing:
        return f"the container tests need {', '.join(missing)} (Debian: apt-get install podman runc busybox-static)"
    if os.geteuid() != 0:
        return "the container tests run podman as root (rootless podman needs subuids, and no --ipc host here)"
    return None


def podman_env(root: Path, image_stores: Sequence[Path] = (), base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment that points podman at `root`: its containers.conf (rendered from CONF_TEMPLATE) and its
    storage.conf (images and containers under root/graph, runtime state under root/run), written now. `image_stores`:
    other roots' graph folders read as additional read-only image stores (one image built once, seen by every node;
    an image of the node's own under the same tag shadows it)."""
    root.mkdir(parents=True, exist_ok=True)
    conf = string.Template(CONF_TEMPLATE.read_text()).substitute(root=str(root))
    (root / "containers.conf").write_text(conf)
    storage = ["[storage]", 'driver = "overlay"', f'graphroot = "{root / "graph"}"', f'runroot = "{root / "run"}"']
    if image_stores:
        stores = ", ".join(f'"{store}"' for store in image_stores)
        storage += ["[storage.options]", f"additionalimagestores = [{stores}]"]
    (root / "storage.conf").write_text("\n".join(storage) + "\n")
    env = dict(os.environ if base is None else base)
    env.update(CONTAINERS_CONF=str(root / "containers.conf"), CONTAINERS_STORAGE_CONF=str(root / "storage.conf"))
    return env


def podman(env: Mapping[str, str], *args: str, stdin: str | None = None, check: bool = True,
           timeout: float = TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    """`podman ARGS` under `env`, its output captured; raises on a failure unless `check` is false."""
    done = subprocess.run(["podman", *args], env=dict(env), input=stdin, capture_output=True, text=True,
                          timeout=timeout)
    if check and done.returncode != 0:
        raise RuntimeError(f"podman {' '.join(args)} exited {done.returncode}: {done.stderr.strip()[-800:]}")
    return done


def rootfs_tar(dest: Path, marker: str = "") -> Path:
    """A root filesystem as a tarball that is the same bytes on every call with the same `marker`: busybox and its
    applets in /bin, /usr empty (this machine's is bind-mounted there), /lib and /lib64 as this machine has them
    (merged /usr: the same links), root in /etc/passwd, `marker` in /etc/ddpl-image (another marker, another image)."""
    applets = subprocess.run([str(BUSYBOX), "--list"], capture_output=True, text=True, check=True).stdout.split()
    with tarfile.open(dest, "w", format=tarfile.GNU_FORMAT) as tar:
        for folder, mode in (("bin", 0o755), ("dev", 0o755), ("etc", 0o755), ("proc", 0o555), ("root", 0o700),
                             ("run", 0o755), ("sys", 0o555), ("tmp", 0o1777), ("usr", 0o755)):
            _add(tar, folder, tarfile.DIRTYPE, mode)
        for name in ("lib", "lib32", "lib64", "libx32", "sbin"):
            host = Path("/") / name
            if host.is_symlink():
                _add(tar, name, tarfile.SYMTYPE, 0o777, link=os.readlink(host))
            elif host.is_dir():
                _add(tar, name, tarfile.DIRTYPE, 0o755)
        _add(tar, "bin/busybox", tarfile.REGTYPE, 0o755, data=BUSYBOX.read_bytes())
        for applet in sorted(set(applets) - {"busybox"}):
            _add(tar, f"bin/{applet}", tarfile.SYMTYPE, 0o777, link="busybox")
        _add(tar, "etc/group", tarfile.REGTYPE, 0o644, data=b"root:x:0:\n")
        _add(tar, "etc/passwd", tarfile.REGTYPE, 0o644, data=b"root:x:0:0:root:/root:/bin/sh\n")
        _add(tar, "etc/ddpl-image", tarfile.REGTYPE, 0o644, data=marker.encode())
    os.utime(dest, (IMAGE_MTIME, IMAGE_MTIME))
    return dest


def _add(tar: tarfile.TarFile, name: str, kind: bytes, mode: int, data: bytes = b"", link: str = "") -> None:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.mtime, info.linkname = kind, mode, IMAGE_MTIME, link
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)


def build_test_image(tag: str, root: Path, marker: str = "", image_stores: Sequence[Path] = ()) -> str:
    """Import `rootfs_tar(marker)` into `root`'s storage as `tag` (~0.3 s, 2 MB); returns the image id. The same
    marker gives the same id in every root; another marker, another id under the same tag."""
    env = podman_env(root, image_stores)
    tar = rootfs_tar(root / "rootfs.tar", marker)
    try:
        podman(env, "import", "--quiet", str(tar), tag)
    finally:
        tar.unlink()
    return image_id(tag, env)


def image_id(image: str, env: Mapping[str, str]) -> str:
    """The image's id (its config's digest: the same image wherever it was imported, pulled or loaded)."""
    return podman(env, "image", "inspect", "--format", "{{.Id}}", image).stdout.strip()


def same_path_mounts(paths: Iterable[str | Path], read_only: bool = False) -> list[str]:
    """`-v P:P` for each path (deduplicated, in order): the workdir, the run's directory, the user's mounts."""
    seen: list[str] = []
    for path in map(str, paths):
        if path not in seen:
            seen.append(path)
    return [arg for path in seen for arg in ("-v", f"{path}:{path}:ro" if read_only else f"{path}:{path}")]


def interpreter_mounts() -> list[str]:
    """This interpreter read-only at its own paths: /usr (the C library, the system Python), its prefix (a pyenv or
    /usr/local build) and its venv; with /lib and /lib64 where they are folders rather than links into /usr."""
    paths = ["/usr", *(f"/{name}" for name in ("lib", "lib64") if Path(f"/{name}").is_dir()
                       and not Path(f"/{name}").is_symlink())]
    for prefix in (sys.base_prefix, sys.prefix):
        if not any(prefix == path or prefix.startswith(path + "/") for path in paths):
            paths.append(prefix)
    return same_path_mounts(paths, read_only=True)


def run_argv(image: str, run: str, node: str, argv: Sequence[str], options: Sequence[str] = (),
             stdin_env: bool = False) -> list[str]:
    """podman's arguments for one node's container of one run, as the agent will start it: named and labelled by
    the run and node; host network, IPC (NCCL) and PID (the hook's pids are the host's; stop kills the whole
    cgroup); output straight into the caller's stdout and stderr (`passthrough`: it still lands there when the
    podman client dies); the run's mark in its environment. `stdin_env`: the command starts under STDIN_ENV, which
    reads secrets from stdin (the caller writes a JSON object and closes it)."""
    python = sys.executable
    start = [python, "-c", STDIN_ENV] if stdin_env else []
    return ["run", *(["--interactive"] if stdin_env else []), "--name", container_name(run, node),
            "--label", f"{RUN_LABEL}={run}", "--label", f"{NODE_LABEL}={node}",
            "--network", "host", "--ipc", "host", "--pid", "host", "--log-driver", "passthrough",
            "--env", f"DDP_LAUNCHER_RUN={run}/{node}", *options, image, *start, *argv]


def container_name(run: str, node: str) -> str:
    """The container's name: podman accepts [a-zA-Z0-9][a-zA-Z0-9_.-]*, so any other character becomes '_'."""
    text = f"ddpl-{run}-{node}"
    return "".join(ch if ch.isascii() and (ch.isalnum() or ch in "_.-") else "_" for ch in text)


def containers_by_label(label: str | Sequence[str], env: Mapping[str, str]) -> list[str]:
    """Names of the containers (any state) carrying every label given as KEY=VALUE (or KEY: any value)."""
    found = podman(env, "ps", "--all", *_label_filters(label), "--format", "{{.Names}}").stdout
    return sorted(found.split())


def _label_filters(label: str | Sequence[str]) -> list[str]:
    labels = [label] if isinstance(label, str) else list(label)
    return [arg for item in labels for arg in ("--filter", f"label={item}")]


def remove_by_label(label: str | Sequence[str], env: Mapping[str, str], grace: float = 0.0) -> list[str]:
    """Stop (TERM, KILL after `grace` seconds) and remove every container carrying the labels; their names.
    `rm -f` alone would wait podman's own 10 s stop timeout before its KILL: hence `stop -t` then `rm -f -t 0`."""
    args = ["ps", "--all", "--no-trunc", *_label_filters(label), "--format", "{{.ID}} {{.Names}}"]
    listed = podman(env, *args).stdout.split()
    found = dict(zip(listed[::2], listed[1::2], strict=True))
    if found:
        podman(env, "stop", "--time", str(round(grace)), *found, check=False, timeout=TIMEOUT_S + grace)
        podman(env, "rm", "--force", "--time", "0", *found, check=False)
        end_runtime_leftovers(found)
    return sorted(found.values())


def end_runtime_leftovers(ids: Iterable[str]) -> int:
    """Kill what the runtime still runs for containers podman has removed; how many processes.

    A podman client killed between runc's create and start leaves a container podman lists as Created (pid 0):
    `podman rm -f` then forgets it (rc 0) while its conmon and `runc init` live on (podman 4.3). conmon names the
    id on its command line (`-c ID`); `runc init` is its child; runc keeps its state in /run/runc/ID."""
    ids = set(ids)
    conmons = [pid for pid, argv in _command_lines().items() if argv[:1] and argv[0].endswith("conmon")
               and ids & set(argv)]
    doomed = [pid for pid, parent in _parents().items() if parent in conmons] + conmons
    for pid in doomed:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    if shutil.which("runc"):
        for cid in ids:
            subprocess.run(["runc", "delete", "--force", cid], capture_output=True, check=False, timeout=TIMEOUT_S)
    return len(doomed)


def _command_lines() -> dict[int, list[str]]:
    found = {}
    for name in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            found[int(name)] = Path(f"/proc/{name}/cmdline").read_bytes().decode(errors="replace").split("\0")
    return found


def _parents() -> dict[int, int]:
    found = {}
    for name in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError, IndexError, ValueError):
            stat = Path(f"/proc/{name}/stat").read_text()
            found[int(name)] = int(stat.rsplit(")", 1)[1].split()[1])
    return found


def discard_root(root: Path) -> None:
    """Remove every container and image of `root`, unmount what is still mounted below it, delete it."""
    if (root / "storage.conf").exists():
        env = podman_env(root)
        ids = podman(env, "ps", "--all", "--quiet", "--no-trunc", check=False).stdout.split()
        podman(env, "rm", "--all", "--force", "--time", "0", check=False)
        end_runtime_leftovers(ids)
        podman(env, "rmi", "--all", "--force", check=False)
    for mount in sorted(_mounts_below(root), key=len, reverse=True):
        subprocess.run(["umount", "--lazy", mount], capture_output=True, check=False)
    shutil.rmtree(root, ignore_errors=True)


def _mounts_below(root: Path) -> list[str]:
    prefix = str(root.resolve()) + "/"
    with open("/proc/self/mountinfo") as handle:
        points = [line.split()[4] for line in handle]
    return [point for point in points if point.startswith(prefix)]
