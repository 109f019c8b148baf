"""`launch --dry-run`'s text (pure): each node's exact command, what each of its settings does, and why each torchrun
flag is there."""

from __future__ import annotations

import shlex

from launcher.config.fields import RESERVED_ENV, SOCKET_ENV
from launcher.config.model import Host, Job
from launcher.node.wire import ATTEMPT_ENV, DEVICE_ORDER
from launcher.plan.launchplan import LaunchPlan, NodeCommand


def dry_run_text(plan: LaunchPlan) -> str:
    """Human-readable plan for `--dry-run`: each node's exact command and what each flag means."""
    rdzv = plan.cluster.rendezvous
    elastic = rdzv.elastic
    world = plan.cluster.world_size if elastic.backend == "static" else None
    low, high = elastic.nodes_range(len(plan.nodes))
    group = "" if elastic.backend == "static" else f" (c10d: trains on {low} to {high} of them)"
    lines = [
        f"run {plan.run_id}: {len(plan.nodes)} node(s){group}, world size {world if world else 'auto'}, "
        f"rendezvous at {rdzv.master_addr}:{rdzv.master_port}",
        "",
    ]
    for node in plan.nodes:
        host = node.host
        lines.append(
            f"node {node.node_rank}: {host.name}"
            + (f" (reached by peers as {host.addr})" if host.addr != host.name else "")
        )
        lines.append(f"  $ {node.shell_line()}")
        lines += [f"  {line}" for line in _feature_lines(node, rdzv.master_addr)]
        lines += [f"  {line}" for line in container_lines(host)]
        lines.append(f"  run dir {node.run_dir}: torchrun runs under setsid, its output in {node.run_dir}/log")
    if plan.cluster.spares:
        names = ", ".join(h.name for h in plan.cluster.spares)
        lines += [
            "",
            f"spares: {names} (no run starts there; a retry takes one that passes the checks in place of a "
            "node that sits out, and the run keeps its size)",
        ]
    unset = plan.nodes[0].unset_env if plan.nodes else RESERVED_ENV
    lines += ["", f"unset from the node's login environment: {', '.join(unset)} (torchrun sets them)"]
    if plan.cluster.sync is not None:
        sync = plan.cluster.sync
        dest = "each node's workdir" if sync.dest is None else sync.dest
        skip = f", except {', '.join(sync.exclude)}" if sync.exclude else ""
        lines.append(f"sync: {sync.src} (on this machine) to {dest}{skip}")
    return "\n".join([*lines, "", *_flag_lines(plan)])


def container_lines(host: Host) -> list[str]:
    """Where a container host's torchrun runs: the image, how the runtime gets it, what is mounted, and what runs
    the launcher's own programs on the node."""
    box = host.container
    if box is None:
        return []
    runtime = "podman, else docker" if box.runtime == "auto" else box.runtime
    mounts = ", ".join(["the workdir", "the node's folder of runs", *box.mounts])
    lines = [
        f"in container {box.image} ({runtime}; pull {box.pull}; named ddpl-<run id>-{host.name}, removed at its end)",
        f"  the node's network, IPC and pids; mounted at their paths: {mounts}; GPUs the runtime's way",
        f"  `{host.python}` and the setup lines are the image's; the node's {box.host_python} runs the agent",
    ]
    if box.options:
        lines.append(f"  more run options: {shlex.join(box.options)}")
    return lines


def _flag_lines(plan: LaunchPlan) -> list[str]:
    """Why each of torchrun's flags is there (the rendezvous' form, the job's), and what a retry adds."""
    elastic = plan.cluster.rendezvous.elastic
    low, high = elastic.nodes_range(len(plan.nodes))
    lines = [
        "why each flag is there:",
        "  -m torch.distributed.run    torchrun, by the node's own interpreter (no PATH surprises)",
    ]
    if elastic.backend == "static":
        lines += [
            f"  --nnodes {len(plan.nodes)}                 every node must be there before training starts",
            "  --node-rank i               this node's place; ranks follow the inventory order",
            "  --master-addr/--master-port where the first node's rendezvous store listens",
        ]
    else:
        lines += [
            f"  {f'--nnodes {low}:{high}':<28}training starts with {low} to {high} nodes and goes on while "
            f"{low} remain",
            "  --rdzv-backend c10d         ranks are assigned when the group forms, and again after a restart",
            "  --rdzv-endpoint/--rdzv-id   the store on the first node (is_host=1 there), this run's id",
            "  --local-addr                the address the other nodes reach this node by",
        ]
    if elastic.max_restarts:
        lines.append(
            f"  {f'--max-restarts {elastic.max_restarts}':<28}torchrun restarts the workers after a "
            "failure (from their checkpoint) this often"
        )
    lines += [
        "  --nproc-per-node G          worker processes on this node (usually its GPU count)",
        "  --redirects 3 --log-dir     each worker writes to files on the node; the launcher's agent tags",
        "                              their lines with local and global rank and sends them to the console",
        *_job_lines(plan.job),
    ]
    if plan.settings.run.retries:  # what the run uses: the command line's over the inventory's
        resume = " ".join(shlex.quote(a) for a in plan.job.resume_args)
        added = (
            f"with {resume} added (job.resume_args)"
            if resume
            else f"with the same arguments (job.resume_args adds some) and {ATTEMPT_ENV}=2, 3, ... in its environment"
        )
        lines.append(
            f"retries: {plan.settings.run.retries}: a run that loses a node is started again on the nodes "
            f"that pass the doctor, {added}"
        )
    return lines


def _job_lines(job: Job) -> list[str]:
    """Why the job's own words are there: its form, and each torchrun option it passes through (job.torchrun)."""
    form, value = job.form
    lines = {
        "script": [],
        "module": [f"  {f'-m {value}':<28}job.module: each worker runs `python -m {value}`"],
        "command": [f"  {f'--no-python {value}':<28}job.command: each worker runs it as it is, not under Python"],
    }
    shown = lines[form]
    options: list[list[str]] = []
    for word in job.torchrun:
        if word.startswith("-") or not options:
            options.append([word])
        else:
            options[-1].append(word)
    shown += [f"  {shlex.join(option):<28}from job.torchrun: passed to torchrun as written" for option in options]
    return shown


def _feature_lines(node: NodeCommand, master: str) -> list[str]:
    """One line per setting for nodes that share nothing, when the node uses it: what it does, and when."""
    lines = []
    if node.setup:
        lines.append(f"setup: {len(node.setup)} line(s) run first, in the shell that then starts torchrun")
    if node.forward_env:
        patterns = ", ".join(f"{f.pattern} (secret)" if f.secret else f.pattern for f in node.forward_env)
        lines.append(f"forward_env: {patterns}: copied from your environment at launch")
    if node.env_file is not None:
        hidden = "; its values are secret, never shown" if node.env_file.secret else ""
        lines.append(f"env_file: {node.env_file.path} is read on this machine at launch{hidden}")
    if node.socket_ifname == "auto":
        lines.append(
            f"socket_ifname auto: {' and '.join(SOCKET_ENV)} name the interface this node routes to "
            f"{master} through, found on the node at launch"
        )
    elif node.socket_ifname is not None:
        lines.append(
            f"socket_ifname: {' and '.join(SOCKET_ENV)} are {node.socket_ifname} (the interface NCCL and gloo use)"
        )
    if node.socket_ifname is not None:
        lines.append(
            "  NCCL gets it as =NAME (that interface only: a bare name is a prefix to NCCL, eth0 would match "
            "eth0.100), gloo the bare name"
        )
    if node.gpus is not None:
        chosen = ",".join(str(i) for i in node.gpus)
        lines.append(
            f"gpus {chosen} (--include/--exclude): CUDA_VISIBLE_DEVICES is the entries {chosen} of the node's "
            f"own CUDA_VISIBLE_DEVICES where its login, setup or env sets one, else {chosen}"
        )
    lines.append(
        f"{DEVICE_ORDER[0]}={DEVICE_ORDER[1]} unless the node sets an order: CUDA numbers the GPUs as nvidia-smi does"
    )
    return lines
