"""Pure planning: a `Cluster` and a `Job` -> the exact torchrun command, environment and run directory per node.

Nothing here touches the network, the file system or `os.environ`: a plan is a value that can be printed
(`--dry-run`), compared in tests, and handed to the transport.
"""

from __future__ import annotations

import datetime as _dt
import secrets
import shlex
from dataclasses import dataclass, field, replace

from launcher.config.fields import RESERVED_ENV
from launcher.config.model import Cluster, EnvFile, EnvVar, ForwardEnv, Host, Job
from launcher.errors import PlanError

# Where each node keeps its run directories, the mark every process of a run carries, what a run id looks like:
# the node side's words, imported from there so both sides spell them alike.
from launcher.node.wire import ATTEMPT_ENV, DEVICE_ORDER, RUNS_ROOT, socket_values
from launcher.plan.settings import for_run
from launcher.settings import Settings

SECRET_MASK = "<secret>"
RANKS_DIR = "ranks"
"""torchrun's --log-dir, inside the run directory: its workers write their output there (--redirects), one
stdout.log and stderr.log per local rank and restart; the node's agent merges them into the run's log, each line
tagged with its local and global rank (`[default1@r3]:`, read from the worker's environment; `launcher.report.lines`
turns the tags into `node-1 r3 |`). torchrun's --tee would hand every line to a Python thread of its own."""
LAUNCHER_ENV: tuple[tuple[str, str], ...] = ()
"""Variables the launcher itself gives torchrun (after the node's agent removed the TORCHELASTIC_* it inherited)."""
C10D_ENV = (("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1"),)
"""Also for a c10d rendezvous: torchrun's workers would share the rendezvous' TCP store across rounds, where the
keys of the round before (the dead workers' gloo addresses) are still there, so a group re-formed after a lost node
fails with `Gloo connectFullMesh failed ... Connection refused` (seen with torch 2.13). Opting out gives every round
a fresh store on its rank 0."""


def new_run_id(now: _dt.datetime | None = None) -> str:
    """A run id that sorts by start time and never repeats: `20261122-031500-a1b2c3`."""
    now = now or _dt.datetime.now()
    return f"{now:%Y%m%d-%H%M%S}-{secrets.token_hex(3)}"


@dataclass(frozen=True)
class NodeCommand:
    """Everything needed to start one node's part of a run."""

    host: Host
    node_rank: int
    rank_offset: int | None
    """Global rank of this node's local rank 0 (None when an earlier node says nproc_per_node: auto)."""
    argv: tuple[str, ...]
    """The torchrun command line, as words (never joined into a shell string for execution)."""
    env: tuple[EnvVar, ...]
    """Environment for torchrun; secrets and from_env values are resolved only at launch time."""
    workdir: str
    run_dir: str
    """This node's run directory; `~` is the node's home."""
    home_args: tuple[int, ...] = ()
    """Indices of argv words whose leading `~/` means the node's home (the interpreter, the log dir)."""
    unset_env: tuple[str, ...] = RESERVED_ENV
    """Names (globs allowed) the node's agent removes from the login environment before starting torchrun."""
    setup: tuple[str, ...] = ()
    """Shell lines run first, in the same shell that starts torchrun (activate an environment, load modules)."""
    socket_ifname: str | None = None
    """NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME: an interface, or "auto" (found on the node: the interface it routes
    to master_addr through); None sets neither."""
    forward_env: tuple[ForwardEnv, ...] = ()
    """Controller variables to copy at launch (the host's); `env` and socket_ifname win over them."""
    env_file: EnvFile | None = None
    """A dotenv file to read on the controller at launch (the host's); everything else wins over its values."""
    launcher_env: tuple[tuple[str, str], ...] = LAUNCHER_ENV
    """Set for torchrun by the agent after `unset_env` (TORCHELASTIC_* names the inventory may not set)."""
    gpus: tuple[int, ...] | None = None
    """`--include host:0,2`'s GPUs, places among those the node shows: the agent makes CUDA_VISIBLE_DEVICES from
    the node's own value (its login, setup, or the inventory's env), or from the indices where none is set."""

    def shell_line(self) -> str:
        """The command as a shell line a user could paste on the node, secrets masked (for --dry-run).

        Setup lines come first, joined with `&&`; then `env -u NAME` for each name torchrun sets (the names that a
        glob in `unset_env` matches, TORCHELASTIC_*, are removed by the agent and named by the dry run's text,
        launcher.plan.dryrun); then the variables in the order in which later ones win: the GPU order (PCI_BUS_ID
        unless the node sets one), the env file and forwarded globs as `<...>` placeholders, forwarded names as
        `NAME="$NAME"`, the socket interface (`<iface to HOST>` for auto), the inventory's env, `--include`'s GPUs
        (`<GPUs 0,2 of ...>`).
        """
        unset = [f"-u {shlex.quote(name)}" for name in self.unset_env if not _is_glob(name)]
        order, default = DEVICE_ORDER
        assignments = [
            *unset,
            f'{order}="${{{order}:-{default}}}"',
            *self._file_and_forwarded(),
            *self._socket_assignments(),
            *(f"{v.name}={_shown_value(v)}" for v in self.env),
            *self._gpu_assignments(),
            *(f"{k}={shlex.quote(v)}" for k, v in self.launcher_env),
        ]
        env = f"env {' '.join(assignments)} " if assignments else ""
        argv = " ".join(quote_path(w) if i in self.home_args else shlex.quote(w) for i, w in enumerate(self.argv))
        setup = "".join(f"{line} && " for line in self.setup)
        return f"{setup}cd {quote_path(self.workdir)} && {env}{argv}"

    def _file_and_forwarded(self) -> list[str]:
        assignments = []
        if self.env_file is not None:
            assignments.append(shlex.quote(f"<from {self.env_file.path}{', secret' if self.env_file.secret else ''}>"))
        for item in self.forward_env:
            if _is_glob(item.pattern):
                assignments.append(shlex.quote(f"<forwarded{', secret' if item.secret else ''}: {item.pattern}>"))
            else:  # a name: its value is the controller's, read at launch
                shown = shlex.quote(SECRET_MASK) if item.secret else _reference(item.pattern)
                assignments.append(f"{item.pattern}={shown}")
        return assignments

    def _socket_assignments(self) -> list[str]:
        if self.socket_ifname is None:
            return []
        value = self.socket_ifname
        if value == "auto":
            master = next(
                (
                    self.argv[i + 1].rsplit(":", 1)[0]
                    for i, w in enumerate(self.argv)
                    if w in ("--master-addr", "--rdzv-endpoint")
                ),
                "master",
            )
            value = f"<iface to {master}>"
        return [f"{name}={shlex.quote(text)}" for name, text in socket_values(value).items()]

    def _gpu_assignments(self) -> list[str]:
        if self.gpus is None:
            return []
        chosen = ",".join(str(i) for i in self.gpus)
        return [f"CUDA_VISIBLE_DEVICES={shlex.quote(f'<GPUs {chosen} among those the node shows>')}"]


@dataclass(frozen=True)
class LaunchPlan:
    """The run id, the nodes' commands in rank order, and why each torchrun flag is there."""

    run_id: str
    cluster: Cluster
    """The nodes, with `job` as their job: what the doctor's start gate checks is what runs."""
    job: Job
    nodes: tuple[NodeCommand, ...]
    settings: Settings = field(default_factory=Settings)
    """Every setting the run uses, resolved once (launcher.plan.settings.for_run): how it is followed and stopped
    (`run`: its hang timeout and on-hang, retries, a stop's grace, the straggler rule's figures), where its output
    goes (`output`), how its nodes are reached (`ssh`)."""


def _is_glob(name: str) -> bool:
    return "*" in name or "?" in name


def _shown_value(var: EnvVar) -> str:
    if var.secret:
        return shlex.quote(SECRET_MASK)
    if var.from_env is not None:
        return _reference(var.from_env)  # it is read from the controller at launch time
    return shlex.quote(var.value or "")


def _reference(name: str) -> str:
    """`"$NAME"`: the variable's value as one word (unquoted, the shell would split it at spaces)."""
    return f'"${name}"'


def quote_path(path: str) -> str:
    """Quote a remote path for a POSIX shell, keeping a leading `~/` meaning the node's home."""
    if path == "~":
        return '"$HOME"'
    if path.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path[2:])
    return shlex.quote(path)


def torchrun_argv(cluster: Cluster, job: Job, node_rank: int, run_dir: str, run_id: str) -> tuple[str, ...]:
    """The torchrun words for one node."""
    host = cluster.hosts[node_rank]
    rdzv = cluster.rendezvous
    elastic = rdzv.elastic
    if elastic.backend == "c10d":
        low, high = elastic.nodes_range(len(cluster.hosts))
        # The first host holds the store (is_host): on loopback or shared addresses torchrun would otherwise let
        # whichever node binds first hold it. --local-addr: the address peers reach this node by.
        conf = ",".join(f"{k}={v}" for k, v in (("is_host", "1" if node_rank == 0 else "0"), *elastic.conf))
        nodes: tuple[str, ...] = ("--nnodes", f"{low}:{high}")
        group: tuple[str, ...] = (
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            f"{_endpoint_host(rdzv.master_addr)}:{rdzv.master_port}",
            "--rdzv-id",
            run_id,
            "--rdzv-conf",
            conf,
            "--local-addr",
            host.addr,
        )
    else:
        nodes = ("--nnodes", str(len(cluster.hosts)), "--node-rank", str(node_rank))
        group = (
            "--master-addr",
            rdzv.master_addr,
            "--master-port",
            str(rdzv.master_port),
        )
    restarts = ("--max-restarts", str(elastic.max_restarts)) if elastic.max_restarts else ()
    return (
        host.python,
        "-m",
        "torch.distributed.run",
        *nodes,
        "--nproc-per-node",
        str(host.nproc_per_node),
        *group,
        *restarts,
        "--redirects",
        "3",
        "--log-dir",
        f"{run_dir}/{RANKS_DIR}",
        *job.torchrun,
        *job.argv,
    )


def _endpoint_host(addr: str) -> str:
    """An IPv6 literal in brackets, as torchrun's HOST:PORT endpoint wants it."""
    return f"[{addr}]" if ":" in addr and not addr.startswith("[") else addr


def rank_offsets(cluster: Cluster) -> dict[str, int | None]:
    """Global rank of each node's local rank 0; None from the first node with nproc_per_node "auto" on, and for
    every node of a c10d rendezvous (ranks are assigned when the group forms)."""
    offsets: dict[str, int | None] = {}
    offset: int | None = 0 if cluster.rendezvous.elastic.backend == "static" else None
    for host in cluster.hosts:
        offsets[host.name] = offset
        offset = None if offset is None or host.nproc_per_node == "auto" else offset + int(host.nproc_per_node)
    return offsets


def _launcher_env(cluster: Cluster, attempt: int) -> tuple[tuple[str, str], ...]:
    """What the launcher itself gives torchrun: LAUNCHER_ENV, C10D_ENV for a c10d run, the attempt after the first."""
    c10d = cluster.rendezvous.elastic.backend == "c10d"
    return LAUNCHER_ENV + (C10D_ENV if c10d else ()) + (((ATTEMPT_ENV, str(attempt)),) if attempt > 1 else ())


def plan_launch(
    cluster: Cluster,
    job: Job | None = None,
    run_id: str | None = None,
    *,
    settings: Settings | None = None,
    attempt: int = 1,
) -> LaunchPlan:
    """Plan a run of `job` (default: the inventory's) on every node of `cluster`, with `settings` (resolved for the run:
    `for_run`; default: the inventory's and the defaults); `attempt` of the launch, which its processes are told
    (ATTEMPT_ENV)."""
    job = job or cluster.job
    if job is None:
        raise PlanError(cluster.source, "no job: give a script, or a `job:` entry in the inventory")
    form, value = job.form
    if value.startswith("-"):
        raise PlanError(
            cluster.source, f"the {form} {value[:60]!r} starts with '-': torchrun would read it as an option"
        )
    low, _ = cluster.rendezvous.elastic.nodes_range(len(cluster.hosts))
    if len(cluster.hosts) < low:
        raise PlanError(
            cluster.source,
            f"rendezvous.nodes asks for at least {low} node(s); only "
            f"{len(cluster.hosts)} are chosen ({', '.join(h.name for h in cluster.hosts)})",
        )
    run_id = run_id or new_run_id()
    offsets = rank_offsets(cluster)
    launcher_env = _launcher_env(cluster, attempt)
    nodes = []
    for rank, host in enumerate(cluster.hosts):
        run_dir = f"{RUNS_ROOT}/{run_id}/{host.name}"
        argv = torchrun_argv(cluster, job, rank, run_dir, run_id)
        nodes.append(
            NodeCommand(
                host=host,
                node_rank=rank,
                rank_offset=offsets[host.name],
                argv=argv,
                home_args=(0, argv.index("--log-dir") + 1),
                env=host.env,
                workdir=host.workdir,
                run_dir=run_dir,
                unset_env=RESERVED_ENV,
                setup=host.setup,
                socket_ifname=host.socket_ifname,
                forward_env=host.forward_env,
                env_file=host.env_file,
                launcher_env=launcher_env,
                gpus=host.gpus,
            )
        )
    # The command line's job (--script, api.launch's module=) replaces the inventory's for all that reads the plan.
    return LaunchPlan(
        run_id=run_id,
        cluster=replace(cluster, job=job),
        job=job,
        nodes=tuple(nodes),
        settings=settings or for_run(Settings(), cluster, job),
    )
