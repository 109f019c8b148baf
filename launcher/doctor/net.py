"""`inv doctor --net`: measure the network the run will use, with the run's own backend and settings.

Every node starts one rank of launcher/doctor/netjob.py under torchrun, as a launch would (the inventory's python,
setup, env, socket_ifname, rendezvous; `torchrun --no-python PYTHON -c SOURCE`, so nothing has to be on the node),
watched like any attached run and ended within NET_TIMEOUT_S. Its answer becomes a `net` column of the doctor's
table and a `net` object per node in its JSON (launcher/doctor/netfigures.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import threading
from collections.abc import Callable
from pathlib import Path

from launcher.config.model import Cluster, Job
from launcher.doctor.evidence import Report
from launcher.doctor.netfigures import NOT_MEASURED, net_verdict
from launcher.errors import LauncherError
from launcher.events import Output
from launcher.limits import NET_BUDGET_S, NET_MAX_ITERS, NET_PAIR_BYTES, NET_SIZES, NET_TIMEOUT_S
from launcher.options import Options
from launcher.plan.launch import LaunchPlan, plan_launch
from launcher.run.wiring import Wiring

SOURCE = Path(__file__).with_name("netjob.py")
MARK = b"NETCHECK "


def net_plan(cluster: Cluster) -> LaunchPlan:
    """One rank a node, running the measurement as `python -c` under `torchrun --no-python`."""
    one_each = dataclasses.replace(cluster, hosts=tuple(dataclasses.replace(h, nproc_per_node=1)
                                                        for h in cluster.hosts), retries=0)
    args = (",".join(str(s) for s in NET_SIZES), str(NET_BUDGET_S), str(NET_PAIR_BYTES), str(NET_MAX_ITERS))
    plan = plan_launch(one_each, Job(script="netjob.py", args=args, hang_timeout=0))
    nodes = []
    for command in plan.nodes:
        at = command.argv.index("netjob.py")
        argv = (*command.argv[:at], "--no-python", command.host.python, "-c", SOURCE.read_text(), *args)
        nodes.append(dataclasses.replace(command, argv=argv, home_words=(*command.home_words, at + 1)))
    return dataclasses.replace(plan, nodes=tuple(nodes))


Starter = Callable[[LaunchPlan, Options, Wiring], int]
"""What runs the measurement's plan to its end: `run_launch.launch_run` over SSH, a step of the job under SLURM."""


def measure(cluster: Cluster, opts: Options, start: Starter | None = None) -> tuple[dict | None, str | None]:
    """Run the measurement on every node: (rank 0's answer, None), or (None, why there is none)."""
    if start is None:
        from launcher.run import launch as run_launch

        start = run_launch.launch_run
    runner: Starter = start
    found: list[dict] = []
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

    quiet = dataclasses.replace(opts, hang_timeout=0, detach=False, retries=0)
    wiring = Wiring(out=io.StringIO(), err=io.StringIO(), on_event=on_event)  # no gate: the doctor just ran
    plan = net_plan(cluster)
    result: list[BaseException] = []

    def run() -> None:
        try:
            runner(plan, quiet, wiring)
        except (LauncherError, OSError) as exc:
            result.append(exc)

    worker = threading.Thread(target=run, daemon=True, name="net")
    worker.start()
    worker.join(NET_TIMEOUT_S)
    if worker.is_alive():
        return None, (f"no answer within {NET_TIMEOUT_S:.0f} s (run {plan.run_id}: its agents stop it as this "
                      "doctor ends and its sessions close)")
    if found:
        return found[-1], None
    if result:
        return None, " ".join(str(result[0]).split())[:400]
    return None, f"run {plan.run_id} ended without its answer"


def with_net(report: Report, cluster: Cluster, opts: Options, start: Starter | None = None) -> Report:
    """The doctor's report with a `net` column and each node's figures."""
    if not report.ok:  # a node that fails its checks cannot join the measurement: it would only time out
        measured, error = None, NOT_MEASURED
    else:
        measured, error = measure(cluster, opts, start)
    # A slow node is flagged from the share a straggler is (a slow node slows every all_reduce): one idea, one number.
    findings, figures, group = net_verdict(report.hosts, measured, error, opts.straggler_factor)
    order = {h: i for i, h in enumerate(report.hosts)}
    merged = sorted((*report.findings, *findings), key=lambda f: order.get(f.host, len(order)))
    return dataclasses.replace(report, checks=(*report.checks, "net"), findings=tuple(merged), net=figures,
                               net_group=group)
