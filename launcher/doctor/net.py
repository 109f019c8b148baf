"""`inv doctor --net`: measure the network the run will use, with the run's own backend and settings.

Every node starts one rank of launcher/doctor/netjob.py under torchrun (with --net-all-gpus one a GPU), as a launch
would (the inventory's python, setup, env, socket_ifname, rendezvous; `torchrun --no-python PYTHON -c SOURCE`, so
nothing has to be on the node), watched like any attached run and ended within NET_TIMEOUT_S. NCCL says its transport
(NCCL_DEBUG=INFO for the measurement). Its answer becomes a `net` column of the doctor's table and a `net` object per
node in its JSON (launcher/doctor/netfigures.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path

from launcher.config.model import Cluster, EnvVar, Job
from launcher.doctor.evidence import Report
from launcher.doctor.netfigures import NOT_MEASURED, nccl_transport, net_verdict
from launcher.errors import LauncherError
from launcher.events import Output
from launcher.limits import NET_BUDGET_S, NET_MAX_ITERS, NET_PAIR_BYTES, NET_SIZES, NET_TIMEOUT_S
from launcher.plan.launchplan import LaunchPlan, plan_launch
from launcher.run.run_io import RunIO
from launcher.settings import Settings

SOURCE = Path(__file__).with_name("netjob.py")
MARK = b"NETCHECK "


NCCL_SAYS = (EnvVar("NCCL_DEBUG", value="INFO"), EnvVar("NCCL_DEBUG_SUBSYS", value="INIT,NET"))
"""The measurement's NCCL says which transport it uses (`NET/IB : Using [0]mlx5_0:1/IB`, `Using network Socket`),
whatever the inventory's NCCL_DEBUG: the doctor reads those lines (netfigures.nccl_transport)."""


def net_plan(cluster: Cluster, settings: Settings | None = None, all_gpus: bool = False) -> LaunchPlan:
    """One rank a node (or, `all_gpus`, each node's nproc_per_node ranks: one a GPU, as nccl-tests' -g, so every
    NIC rail and NVLink carries its share), running the measurement as `python -c` under `torchrun --no-python`.
    The measurement is a run of its own, with the command's `settings` but attached, never started again and never
    watched for a hang (its own bound is NET_TIMEOUT_S)."""
    settings = settings or Settings()
    quiet = dataclasses.replace(
        settings,
        run=dataclasses.replace(settings.run, hang_timeout=0, detach=False, retries=0, on_hang="stop", notes=()),
    )
    hosts = tuple(
        dataclasses.replace(
            h,
            nproc_per_node=h.nproc_per_node if all_gpus else 1,
            env=(*(v for v in h.env if v.name not in {e.name for e in NCCL_SAYS}), *NCCL_SAYS),
        )
        for h in cluster.hosts
    )
    args = (",".join(str(s) for s in NET_SIZES), str(NET_BUDGET_S), str(NET_PAIR_BYTES), str(NET_MAX_ITERS))
    plan = plan_launch(
        dataclasses.replace(cluster, hosts=hosts, retries=0),
        Job(script="netjob.py", args=args, hang_timeout=0),
        settings=quiet,
    )
    nodes = []
    for command in plan.nodes:
        at = command.argv.index("netjob.py")
        argv = (*command.argv[:at], "--no-python", command.host.python, "-c", SOURCE.read_text(), *args)
        nodes.append(dataclasses.replace(command, argv=argv, home_args=(*command.home_args, at + 1)))
    return dataclasses.replace(plan, nodes=tuple(nodes))


Starter = Callable[[LaunchPlan, RunIO], int]
"""What runs the measurement's plan to its end: `run_launch.launch_run` over SSH, a step of the job under SLURM."""


def measure(
    cluster: Cluster, settings: Settings, start: Starter | None = None, all_gpus: bool = False
) -> tuple[dict | None, str | None]:
    """Run the measurement on every node: (rank 0's answer with each node's NCCL transport, None), or (None, why
    there is none)."""
    if start is None:
        from launcher.run import launch as run_launch

        start = run_launch.launch_run
    runner: Starter = start
    found: list[dict] = []
    transport: dict[str, dict[str, str]] = {}  # node -> what its NCCL said of its transport
    pending: dict[str, bytes] = {}  # a node's output not yet ended by a newline
    lock = threading.Lock()

    def on_event(event: object) -> None:  # from the nodes' reader threads
        if not isinstance(event, Output):
            return
        with lock:
            *lines, pending[event.node] = (pending.get(event.node, b"") + event.data).split(b"\n")
            for line in lines:
                if MARK in line:
                    with contextlib.suppress(ValueError):
                        found.append(json.loads(line.split(MARK, 1)[1]))
                elif b"NCCL INFO" in line:
                    nccl_transport(line.decode("utf-8", "replace"), transport.setdefault(event.node, {}))

    run_io = RunIO(out=io.StringIO(), err=io.StringIO(), on_event=on_event)  # no gate: the doctor just ran
    plan = net_plan(cluster, settings, all_gpus)
    result: list[BaseException] = []

    def run() -> None:
        try:
            runner(plan, run_io)
        except (LauncherError, OSError) as exc:
            result.append(exc)

    worker = threading.Thread(target=run, daemon=True, name="net")
    worker.start()
    worker.join(NET_TIMEOUT_S)
    if worker.is_alive():
        return None, (
            f"no answer within {NET_TIMEOUT_S:.0f} s (run {plan.run_id}: its agents stop it as this "
            "doctor ends and its sessions close)"
        )
    if found:
        return {**found[-1], "transport": transport}, None
    if result:
        return None, " ".join(str(result[0]).split())[:400]
    return None, f"run {plan.run_id} ended without its answer"


def with_net(
    report: Report, cluster: Cluster, settings: Settings, start: Starter | None = None, all_gpus: bool = False
) -> Report:
    """The doctor's report with a `net` column and each node's figures (`all_gpus`: measured over all of each node's
    GPUs, `net_plan`)."""
    error: str | None
    began = time.monotonic()
    if not report.ok:  # a node that fails its checks cannot join the measurement: it would only time out
        measured, error = None, NOT_MEASURED
    else:
        measured, error = measure(cluster, settings, start, all_gpus)
    # the report's time is the whole doctor's, the measurement too (it said `in 0.9 s` after 11.8 s)
    timings = {**report.timings, "net_s": round(time.monotonic() - began, 3)}
    timings["total_s"] = round(float(report.timings.get("total_s", 0.0)) + timings["net_s"], 3)
    if measured is not None:  # each node's InfiniBand ports, as its probe found them: a fall back to sockets is said
        measured["ib"] = {h: (p or {}).get("ib") or [] for h, p in report.probes.items()}
    # A slow node is flagged from the share a straggler is (a slow node slows every all_reduce): one idea, one number.
    findings, figures, group = net_verdict(report.hosts, measured, error, settings.run.straggler_factor)
    order = {h: i for i, h in enumerate(report.hosts)}
    merged = sorted((*report.findings, *findings), key=lambda f: order.get(f.host, len(order)))
    return dataclasses.replace(
        report, checks=(*report.checks, "net"), findings=tuple(merged), net=figures, net_group=group, timings=timings
    )
