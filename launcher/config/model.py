"""The typed inventory: a Cluster of Hosts, its Rendezvous (static or elastic), its Job, and what each node gets
besides (forwarded variables, an env file, code sync), with the keys each mapping may have. Values, no I/O."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from launcher.options import DEFAULT_MASTER_PORT

HostKeyPolicy = Literal["strict", "accept-new"]


HOST_KEY_POLICIES: tuple[str, ...] = ("strict", "accept-new")


Backend = Literal["static", "c10d"]


BACKENDS: tuple[str, ...] = ("static", "c10d")


ELASTIC_KEYS = ("backend", "nodes", "max_restarts", "conf")
"""Keys of `rendezvous:` besides master_addr and master_port."""


DEFAULT_RESUME_ARGS: tuple[str, ...] = ()
"""What a retried attempt adds to the job's arguments unless the job says otherwise (`job.resume_args`): nothing, as
torchrun restarts its workers with the same arguments. `--resume` was the default, and broke every script without
that option in its second attempt (`unrecognized arguments: --resume`), an hour into a run; a retry's processes are
told their attempt in the environment instead (launcher.node.wire.ATTEMPT_ENV), which breaks nothing."""


OWN_CONF = ("is_host",)
"""`--rdzv-conf` keys the plan sets per node (the first host holds the store): `rendezvous.conf` may not."""

FORWARD_ENV_KEYS = ("pattern", "secret")


ENV_FILE_KEYS = ("path", "secret")


SYNC_KEYS = ("src", "dest", "exclude", "relay")

TOP_KEYS = ("defaults", "hosts", "spares", "rendezvous", "job", "ssh_config", "host_key_policy", "sync", "retries")


HOST_KEYS = (
    "user",
    "port",
    "identity_file",
    "python",
    "workdir",
    "nproc_per_node",
    "env",
    "setup",
    "forward_env",
    "env_file",
    "socket_ifname",
    "container",
)


CONTAINER_KEYS = ("image", "runtime", "mounts", "options", "pull", "host_python")


Runtime = Literal["auto", "podman", "docker"]


RUNTIMES: tuple[str, ...] = ("auto", "podman", "docker")


PullPolicy = Literal["missing", "always", "never"]


PULL_POLICIES: tuple[str, ...] = ("missing", "always", "never")


RENDEZVOUS_KEYS = ("master_addr", "master_port", *ELASTIC_KEYS)


JOB_FORMS = ("script", "module", "command")
"""What torchrun runs, one of them: a script (`torchrun train.py`), a module (`torchrun -m pkg.train`), or a program
that is not Python (`torchrun --no-python ./train.sh`)."""


JOB_KEYS = (*JOB_FORMS, "args", "torchrun", "resume_args", "hang_timeout", "on_hang", "progress")
"""What a suspected hang does once every rank's stack is taken: stop the run (exit code 124), keep it, or stop this
attempt and start the run again (`retries` left) without the node that held it up, where the run can do without it."""


ENV_KEYS = ("value", "from_env", "secret")


OTHER_WORDS = {
    "nodes": "hosts",
    "machines": "hosts",
    "host": "name",
    "hostname": "name",
    "ip": "name",
    "address": "name",
    "slots": "nproc_per_node",
    "gpus": "nproc_per_node",
    "nproc": "nproc_per_node",
    "gpus_per_node": "nproc_per_node",
    "num_gpus": "nproc_per_node",
    "username": "user",
    "key_filename": "identity_file",
    "identityfile": "identity_file",
    "ssh_key": "identity_file",
    "cwd": "workdir",
    "working_dir": "workdir",
    "environment": "env",
    "arguments": "args",
    "entrypoint": "script",
    "program": "script",
    "rdzv": "rendezvous",
    "rdzv_backend": "backend",
}
"""Keys other launchers and inventories use for one of ours (Fabric's, Ansible's, DeepSpeed's, SkyPilot's, torchrun's
spelling): an unknown key that is one of them is answered with ours where ours is allowed there, as a near miss is.
A host's address in theirs is where the controller connects: our `name` (`addr`, how peers reach it, defaults to it)."""


DEFAULTS: dict[str, Any] = {"python": "python3", "workdir": "~", "nproc_per_node": 1}


@dataclass(frozen=True)
class ForwardEnv:
    """Variables of the controller's environment copied to torchrun on the node at launch, chosen by a glob."""

    pattern: str
    """A variable name, or a glob of names with `*` and `?` (`WANDB_*`); names in RESERVED_ENV are never copied."""
    secret: bool = False
    """Copied values are never shown or logged; a name that any secret pattern matches is secret."""


@dataclass(frozen=True)
class EnvFile:
    """A dotenv file read on the controller at launch (not when the inventory is read); sets variables on the node."""

    path: str
    """The file on the controller: a relative path is already joined to the inventory's folder; `~` is your home."""
    secret: bool = False
    """Its values are never shown or logged."""


@dataclass(frozen=True)
class SyncSpec:
    """What `sync:` copies from the controller to every node."""

    src: str = "."
    """A local folder, as written; a relative path is relative to the current directory at sync time."""
    dest: str | None = None
    """The folder on each node (`~/` is the node's home); None means each host's workdir."""
    exclude: tuple[str, ...] = ()
    """gitignore-style patterns of paths that are not copied."""
    relay: bool | None = None
    """Whether nodes pass the tree on to each other (launcher/sync/relay.py): True, False, or None for `auto`."""


@dataclass(frozen=True)
class Elastic:
    """How torchrun forms its worker group: `static` (every node, fixed ranks: the default) or `c10d` (a rendezvous
    that admits MIN to MAX nodes and re-forms the group, without a lost node, up to `max_restarts` times)."""

    backend: Backend = "static"
    min_nodes: int | None = None
    """c10d: the fewest nodes that may train; None means every host (`nodes:` not given)."""
    max_nodes: int | None = None
    """c10d: the most nodes admitted; None means every host."""
    max_restarts: int = 0
    """torchrun's --max-restarts: how often it restarts the worker group (after a failure, or a node lost) itself."""
    conf: tuple[tuple[str, str], ...] = ()
    """Extra `--rdzv-conf key=value` pairs (c10d), e.g. last_call_timeout, join_timeout."""

    def nodes_range(self, hosts: int) -> tuple[int, int]:
        """(MIN, MAX) for a cluster of `hosts` hosts: static runs need all of them."""
        if self.backend == "static":
            return hosts, hosts
        return (self.min_nodes or hosts, min(self.max_nodes or hosts, hosts))


@dataclass(frozen=True)
class EnvVar:
    """One environment variable set for torchrun on a node."""

    name: str
    value: str | None = None
    """The literal value, or None when it is read from the controller's environment."""
    from_env: str | None = None
    """Name of the controller's environment variable to copy at launch time."""
    secret: bool = False
    """Never shown in argv, dry-runs or logs; sent over stdin and kept in a 0600 file on the node."""


@dataclass(frozen=True)
class Container:
    """The image torchrun runs in on a node (`container:`): one container a node and run, started and owned by the
    node's agent, on the node's network, IPC and pids, its workdir and the run's folder mounted at the same paths."""

    image: str
    """The image reference, as the runtime takes it (`nvcr.io/nvidia/pytorch:24.05-py3`, `localhost/train:1`)."""
    runtime: Runtime = "auto"
    """podman or docker; auto: podman where the node has it, else docker."""
    mounts: tuple[str, ...] = ()
    """More bind mounts: `PATH` (same path inside), `SRC:DEST`, `SRC:DEST:ro`; `~` is the node's home."""
    options: tuple[str, ...] = ()
    """More options of the runtime's `run` (`--shm-size=16g`), before the image; the launcher's own are refused."""
    pull: PullPolicy = "missing"
    """When the runtime pulls the image at the start: missing (only then), always, never (`launch --pull` pulls on
    every node at once first)."""
    host_python: str = "python3"
    """The node's own Python (3.8+, stdlib only) that runs the launcher's agent; the host's `python:` is the image's."""


@dataclass(frozen=True)
class Host:
    """One node of the cluster."""

    name: str
    """How the controller reaches it: an ssh alias (from ssh config) or an address."""
    addr: str
    """How the other nodes reach it (defaults to `name`); also what the doctor resolves on every node."""
    python: str
    """The interpreter on the node; torchrun runs as `PYTHON -m torch.distributed.run`."""
    workdir: str
    """Directory on the node where the job's script lives and torchrun starts."""
    nproc_per_node: int | Literal["auto"]
    """Worker processes on this node (usually its GPU count), or "auto" (torchrun decides)."""
    user: str | None = None
    """ssh user; None leaves it to ssh config (then the local user)."""
    port: int | None = None
    """ssh port; None leaves it to ssh config (then 22)."""
    identity_file: str | None = None
    """ssh private key; ssh config and ssh-agent are honoured too."""
    env: tuple[EnvVar, ...] = ()
    """Extra environment for torchrun on this node (defaults' env merged with the host's); it wins over the rest."""
    setup: tuple[str, ...] = ()
    """Shell lines run on the node before torchrun (and the doctor's probe), in the same shell, as written."""
    forward_env: tuple[ForwardEnv, ...] = ()
    """Controller variables copied at launch, by glob (defaults' list, then the host's); `env` wins over them."""
    env_file: EnvFile | None = None
    """A dotenv file read on the controller at launch; forwarded variables and `env` win over its values."""
    socket_ifname: str | None = None
    """NCCL_/GLOO_SOCKET_IFNAME on the node: an interface, or "auto" (the one it routes to master_addr through)."""
    gpus: tuple[int, ...] | None = None
    """The GPUs `--include`/`--exclude` chose (`host:0,2`), as places among those the node shows: its own
    CUDA_VISIBLE_DEVICES where its login or setup sets one, else all its GPUs; None: every GPU it shows."""
    container: Container | None = None
    """The image torchrun runs in on this node (its `python` and `setup` are then the image's); None: bare."""


@dataclass(frozen=True)
class Rendezvous:
    """Where torchrun's rendezvous store listens (on the first node by default), and how the group forms."""

    master_addr: str
    master_port: int = DEFAULT_MASTER_PORT
    master_addr_explicit: bool = False
    """Whether the inventory set master_addr; when it did not, it follows the first host (see `select_hosts`)."""
    elastic: Elastic = field(default_factory=Elastic)
    """static (every node, fixed ranks) or c10d with MIN:MAX nodes; torchrun's own restarts."""


@dataclass(frozen=True)
class Job:
    """What torchrun runs on every node: exactly one of `script`, `module` and `command`, with its arguments."""

    script: str | None = None
    """Path of the training script, relative to each node's workdir (or absolute)."""
    args: tuple[str, ...] = ()
    """Arguments for the script (module, command), passed byte for byte."""
    resume_args: tuple[str, ...] = DEFAULT_RESUME_ARGS
    """Added to `args` when the launcher retries a failed run (`retries`): how the script resumes its checkpoint."""
    hang_timeout: float | None = None
    """launcher.settings.HANG_TIMEOUT_HELP; None: learnt; 0: never. `--hang-timeout` (or the `hang_timeout`
    setting) wins."""
    on_hang: str | None = None
    """ON_HANG's: what a suspected hang does; None: `stop`. `--on-hang` wins."""
    progress: str | None = None
    """A regular expression of a rank's progress lines, its group `step` the step (`inv top`'s rates and
    stragglers); None: launcher.options.DEFAULT_PROGRESS (`step N`, tqdm's `N/M`)."""
    module: str | None = None
    """A Python module torchrun runs as `python -m MODULE` in each worker (`torchrun -m pkg.train`)."""
    command: str | None = None
    """A program torchrun runs as it is, not under Python (`torchrun --no-python`): a shell wrapper, a binary."""
    torchrun: tuple[str, ...] = ()
    """torchrun options the launcher does not set itself (`--numa-binding socket`), passed before the job's words."""

    @property
    def form(self) -> tuple[str, str]:
        """Which of JOB_FORMS this job is, and its value (`("module", "pkg.train")`)."""
        for name in JOB_FORMS:
            value = getattr(self, name)
            if value is not None:
                return name, value
        raise ValueError("a job names no script, module or command")

    @property
    def argv(self) -> tuple[str, ...]:
        """What follows torchrun's own options: the script, `-m MODULE` or `--no-python COMMAND`, then `args`."""
        form, value = self.form
        flag = {"script": (), "module": ("-m",), "command": ("--no-python",)}[form]
        return (*flag, value, *self.args)


@dataclass(frozen=True)
class Cluster:
    """A validated inventory: the nodes in rank order, the rendezvous point and the job."""

    source: str
    """The file it was read from (for messages)."""
    hosts: tuple[Host, ...]
    rendezvous: Rendezvous
    job: Job | None = None
    ssh_config: str | None = None
    """An ssh config file to read instead of ~/.ssh/config."""
    host_key_policy: HostKeyPolicy = "strict"
    """strict: only hosts in known_hosts; accept-new: learn an unknown host's key once, refuse a changed one."""
    sync: SyncSpec | None = None
    """What to copy from the controller to every node (`sync:`); None: nothing."""
    retries: int = 0
    """How often the launcher relaunches a run that lost a node (`retries:`; `inv launch --retries` wins)."""
    spares: tuple[Host, ...] = ()
    """Hosts that start no run (`spares:`, hot spares): a retry takes one that passes the checks in place of a node
    that sits out, and the run keeps its size."""
    lines: Mapping[str, int] = field(default_factory=dict, compare=False, repr=False)
    """Line numbers of entries in the source ("hosts[1]" -> 7), for messages of later checks."""

    def host(self, name: str) -> Host:
        """The host called `name` (KeyError if there is none)."""
        for host in self.hosts:
            if host.name == name:
                return host
        raise KeyError(name)

    @property
    def world_size(self) -> int | None:
        """Total worker processes, or None when some node says "auto"."""
        counts = [h.nproc_per_node for h in self.hosts]
        return None if "auto" in counts else sum(int(c) for c in counts)
