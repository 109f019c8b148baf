"""Driver for the fan-out figure: launch a plan whose torchrun is replaced by a light command, then exit.

    python -m bench._drive INVENTORY [--preflight] [--detach] [--log-dir DIR] [--trace OUT.json] [-- ARGV...]

It is started as a fresh process so that its time includes the launcher's own start-up (imports), like a user's
`inv launch`. Default light command: `<the host's python> -c pass`. Exit code: the launch's.

--trace writes a timeline (time.time() stamps) of the launcher's phases, found by wrapping a few of its functions
from the outside and from the run's typed events (`RunIO.on_event`): imports, each host's `ssh -G` and connect,
each channel opened (and how many sessions each node got: `sessions`), the doctor's `probed` and `tcp` answers and
`ready` (with --preflight, in the start sessions), each node's agent `started`/`exited` events (stamped by the
node), and the end of `launch`.
"""

from __future__ import annotations

import sys
import time
from typing import Any

T0 = time.perf_counter()
MAIN_WALL = time.time()


def cpu_now() -> float:
    """CPU seconds of this process (all its threads) and of the children it waited for (each host's `ssh -G`)."""
    import os

    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


MAIN_CPU = cpu_now()  # the interpreter's start is before it


def _install_trace() -> dict:
    """Wrap launcher functions to stamp the phases of a launch; returns the dict the stamps go into."""
    import threading

    from launcher import events as supervise
    from launcher.transport import connections as transport

    trace: dict = {"resolve": {}, "connect": {}, "channel": {}, "sessions": {}, "started": {}, "exited": {}, "cpu": {}}
    lock = threading.Lock()

    def wrap(module, name, record):
        original = getattr(module, name)

        def wrapper(*a, **kw):
            start = time.time()
            try:
                return original(*a, **kw)
            finally:
                with lock:
                    record(a, start, time.time())

        setattr(module, name, wrapper)

    from launcher.run import launch as run_launch

    original_connect = run_launch.connect_or_fail

    def connect_or_fail(*a, **kw):  # the whole connect phase's CPU (every host's ssh -G, handshake, auth)
        trace["cpu"]["connect_start"] = cpu_now()
        try:
            return original_connect(*a, **kw)
        finally:
            trace["cpu"]["connected"] = cpu_now()

    run_launch.connect_or_fail = connect_or_fail
    wrap(transport, "resolve_target", lambda a, s, e: trace["resolve"].__setitem__(a[0].name, (s, e)))
    wrap(transport, "connect", lambda a, s, e: trace["connect"].__setitem__(a[0].name, (s, e)))
    def channel_opened(a, s, e):  # each session's span (the last one a node's) and how many each node opened
        trace["channel"][a[0].name] = (s, e)
        trace["sessions"][a[0].name] = trace["sessions"].get(a[0].name, 0) + 1

    wrap(transport.Node, "open_channel", channel_opened)

    stamped = {supervise.Probed: "probed", supervise.Reached: "reached", supervise.Ready: "ready"}  # controller clock

    def on_event(event):  # typed node events: nothing in launcher/ is wrapped for these
        if isinstance(event, supervise.Started):
            trace["started"][event.node] = (event.node_time or event.time, event.time)
        elif type(event) in stamped:
            trace.setdefault(stamped[type(event)], {})[event.node] = event.time
        elif isinstance(event, supervise.Ended):
            trace["exited"][event.node] = (event.node_time or event.time, event.time)

    trace["on_event"] = on_event
    return trace


def _arguments(argv: list[str]) -> Any:
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("inventory")
    parser.add_argument("--preflight", action="store_true", help="run the doctor's fast checks first")
    parser.add_argument("--log-dir", default=None)
    parser.add_argument("--timings", action="store_true", help="print phase times to stderr as JSON")
    parser.add_argument("--trace", default=None, help="write a timeline of the launcher's phases (JSON) here")
    parser.add_argument("--torchrun", action="store_true", help="keep the plan's torchrun command (no light command)")
    parser.add_argument("--detach", action="store_true", help="start the run detached and return (inv launch --detach)")
    parser.add_argument("light", nargs="*", help="the light command (default: PYTHON -c pass)")
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    import dataclasses
    from pathlib import Path

    args = _arguments(argv)

    import gc

    gc.disable()  # as tasks.py does around its imports (`inv launch`)
    from launcher.config.inventory import load_inventory
    from launcher.plan.launchplan import plan_launch
    from launcher.plan.settings import for_run
    from launcher.run import launch as run_launch
    from launcher.run.run_io import RunIO
    from launcher.settings import Settings

    gc.freeze()
    gc.enable()
    t_import = time.perf_counter()
    trace = _install_trace() if args.trace else None
    cluster = load_inventory(args.inventory)
    settings = Settings.of(detach=args.detach, **({"log_dir": Path(args.log_dir)} if args.log_dir else {}))
    plan = plan_launch(cluster, settings=for_run(settings, cluster))
    nodes = tuple(
        dataclasses.replace(c, argv=tuple(args.light) if args.light else (c.host.python, "-c", "pass"),
                            home_args=(0,))
        for c in plan.nodes
    )
    if not args.torchrun:
        plan = dataclasses.replace(plan, nodes=nodes)
    run_io = RunIO(out=sys.stdout, err=sys.stderr)
    if args.preflight:
        from launcher.doctor import default_gate

        run_io = dataclasses.replace(run_io, gate=default_gate)  # inside the agents' start sessions, as `inv launch`
    if trace is not None:
        run_io = dataclasses.replace(run_io, on_event=trace.pop("on_event"))
        trace["main"] = MAIN_WALL
        trace["imported"] = time.time() - (time.perf_counter() - t_import)
        trace["planned"] = time.time()
        trace["cpu"].update(main=MAIN_CPU, imported_planned=cpu_now())
    try:
        code = run_launch.launch_run(plan, run_io)
    finally:
        if trace is not None:
            import json

            trace["returned"] = time.time()
            trace["cpu"]["returned"] = cpu_now()
            Path(args.trace).write_text(json.dumps(trace))
    if args.timings:
        import json

        print(json.dumps({"import_s": round(t_import - T0, 4), "launch_s": round(time.perf_counter() - t_import, 4)}),
              file=sys.stderr)
    return code


def peak_rss_kb() -> int:
    """This process's own peak resident memory (VmHWM). Not ru_maxrss from wait4(): a child forked from a big
    parent (the bench) keeps the parent's high-water mark across exec, which would hide a smaller launcher."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


if __name__ == "__main__":
    try:
        code = main(sys.argv[1:])
    finally:
        print(f"bench-driver-peak-rss-kb: {peak_rss_kb()}", file=sys.stderr)
    sys.exit(code)
