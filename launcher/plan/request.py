"""What a node's agent is asked to do for a launch (pure): the start request, every setting in it resolved here from
the plan and the options, and every number the agent uses (it has no defaults of its own). `inv launch --dry-run`
can show it; run/ only sends it."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from launcher.config.model import Cluster, Host, Job
from launcher.limits import (
    ATTACH_TAIL_BYTES,
    AWAY_AFTER_BEATS,
    COLLECTIVES,
    CUT_MARK,
    EVENT_CHUNK,
    FLIGHT_RECORDER_ENV,
    LOG_CHUNK,
    LOG_POLL_S,
    MAX_LINE_BYTES,
    NCCL_DUMP_WAIT_S,
    NCCL_MAX_BYTES,
    NODE_TIMING,
    NVIDIA_SMI_TIMEOUT_S,
    SERIES,
    STACKS_WAIT_S,
    TOP_GPU_REFRESH_S,
    TOP_KEEP_LINES,
    TOP_RATE_WINDOW_S,
    TOP_READ_S,
    TOP_TAIL_BYTES,
    heartbeat_interval,
)
from launcher.options import DEFAULT_PROGRESS
from launcher.plan.containerplan import container_request
from launcher.plan.launchplan import RANKS_DIR, LaunchPlan, NodeCommand


class GateSection(Protocol):
    """The start gate's part of a node's request (launcher.run.gate.StartGate): what the agent probes first."""

    def node_section(self, cluster: Cluster, host: Host, run_id: str) -> dict[str, Any] | None: ...


@dataclass(frozen=True)
class Owner:
    """The launcher that owns an attached run: the token its nodes know it by (its reconnects are taken at once, another
    launcher's only with `attach`) and who it is, as `status` and a launcher that lost the run say it."""

    token: str
    who: str


def inventory_id(cluster: Cluster) -> str:
    """How a run records the inventory it was started from: its path as this controller resolves it (a hostfile's
    too); `inv stop` without --run chooses the runs that were started from the same one."""
    return str(Path(cluster.source).resolve())


def start_request(
    plan: LaunchPlan,
    command: NodeCommand,
    env: Mapping[str, str],
    gate: GateSection | None = None,
    owner: Owner | None = None,
    reattach: bool = True,
) -> dict[str, Any]:
    """Everything the node's agent needs to start its part; every number comes from the plan's settings and the
    launcher's limits (it has no defaults). With a `gate` (the doctor's checks), its `gate` part. `owner`: the
    launcher the run's supervisor takes back at once when it reconnects; `reattach`: whether one can (over SSH; under
    SLURM srun owns it). `script`: the job's, which the agent keeps a copy of (its ranks' stacks read their lines
    from it when the file changed since they started). `env` is `resolve_env`'s (launcher.run.nodeenv.NodeEnv): the
    names it marks secret (and the inventory's secret `env`) go in `secret_names`, kept out of command.json."""
    secret = {v.name for v in command.env if v.secret} | set(getattr(env, "secret_names", ()))
    rdzv, run = plan.cluster.rendezvous, plan.settings.run
    request: dict[str, Any] = {
        "action": "start",
        "timing": NODE_TIMING,
        "run_dir": command.run_dir,
        "mark": f"{plan.run_id}/{command.host.name}",
        "workdir": command.workdir,
        "argv": list(command.argv),
        "script": plan.job.script,
        "expand_home": list(command.home_args),
        "env": dict(env),
        "launcher_env": dict(command.launcher_env),
        "secret_names": sorted(secret),
        "unset_env": list(command.unset_env),
        "socket_ifname": command.socket_ifname,
        "gpus": None if command.gpus is None else list(command.gpus),
        "master_addr": rdzv.master_addr,
        "master_port": rdzv.master_port,
        "node_rank": command.node_rank,
        "nodes": [c.host.name for c in plan.nodes],  # recorded on the node: `inv stop` tells this run's nodes
        "inventory": inventory_id(plan.cluster),  # ... and which inventory started it
        "detach": run.detach,
        "grace": run.grace,
        "heartbeat_timeout": run.heartbeat_bound,
        "alive_interval": heartbeat_interval(run.silence_timeout),
        "owner": owner.token if owner else None,
        "who": owner.who if owner else None,
        "reattach": reattach and not run.detach,
        "away_after_s": AWAY_AFTER_BEATS * heartbeat_interval(run.heartbeat_bound),
        "attach_tail_bytes": ATTACH_TAIL_BYTES,
        "log_tail": log_tail_settings(),
        **stacks_settings(),
        "watch": True,  # each rank's progress in the agent's beats (the hang watch's, the loss rules')
        "on_nonfinite": run.on_nonfinite,  # a detached run's nodes stop their part themselves
        "top": progress_settings(plan.job),  # with the watch: each rank's step rate (stragglers)
        "series": dict(SERIES),  # the run's page: what `inv top` reads, sampled by the run's supervisor
    }
    if command.host.container is not None:  # torchrun in the image (launcher/node/agent/container.py)
        request["container"] = container_request(command.host.container, command.host.setup)
    section = gate.node_section(plan.cluster, command.host, plan.run_id) if gate else None
    if section is not None:  # the doctor's probe, run by the agent before it says ready
        request["gate"] = section
    return request


def stacks_settings() -> dict[str, Any]:
    """How a node's agent takes stacks and keeps NCCL's flight recorder (launcher/node/agent/stackdump.py): every
    number."""
    return {
        "stacks_wait_s": STACKS_WAIT_S,
        "nccl_max_bytes": NCCL_MAX_BYTES,
        "flight_recorder": FLIGHT_RECORDER_ENV,
        "nccl_dump_wait_s": NCCL_DUMP_WAIT_S,
        "event_chunk": EVENT_CHUNK,
        "collectives": COLLECTIVES,
    }


def progress_settings(job: Job | None) -> dict[str, Any]:
    """How a node's agent reads its ranks' progress lines (launcher/node/agent/sampler.py): the expression, every
    number."""
    return {
        "ranks": RANKS_DIR,
        "progress": (job.progress if job else None) or DEFAULT_PROGRESS,
        "read_s": TOP_READ_S,
        "tail_bytes": TOP_TAIL_BYTES,
        "keep_lines": TOP_KEEP_LINES,
        "rate_window_s": TOP_RATE_WINDOW_S,
        "gpu_timeout_s": NVIDIA_SMI_TIMEOUT_S,
        "gpu_refresh_s": TOP_GPU_REFRESH_S,
    }


def log_tail_settings() -> dict[str, Any]:
    """How a node's agent merges its workers' files into the run's log (`agent.LogMerger`): every number here."""
    return {
        "ranks": RANKS_DIR,
        "poll_s": LOG_POLL_S,
        "chunk": LOG_CHUNK,
        "max_line": MAX_LINE_BYTES,
        "cut_mark": CUT_MARK.decode(),
    }


def shown_request(plan: LaunchPlan) -> list[str]:
    """`--dry-run`'s last lines: the request the first node's agent would get, as JSON. Secret values are shown by
    name only; what is read at launch (env files, forward_env, a value copied from this machine's environment) is
    not read here, and the doctor's part (`gate`) is left out."""
    command = plan.nodes[0]
    env = {
        v.name: f"<secret {v.name}>" if v.secret else v.value if v.value is not None else f"<${v.from_env} at launch>"
        for v in command.env
    }
    request = start_request(plan, command, env)
    return [
        f"the request {command.host.name}'s agent gets (the other nodes' differ in node_rank, run_dir and mark; "
        "env files and forward_env are read at launch):",
        json.dumps(request, indent=1, sort_keys=True),
    ]
