"""Table rows of the figures that go to 64 nodes: fan-out, the doctor, the launcher's own cost, stop at scale.

Each row: [figure, N, launcher, (a) ssh loop, (p) pdsh, (d) floor, ratio, target, verdict].
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bench.fanout import target_plain

Cell = Callable[..., str]

COST_SIZES = (16, 32, 64)
"""The N at which the launcher's own cost (CPU, memory, threads, fds) gets a row (those measured)."""


def _ratios(r: dict[str, Any], a: str, p: str) -> str:
    parts = [f"{r[a]:.2f}x (a)" if r.get(a) is not None else "",
             f"{r[p]:.2f}x (p)" if r.get(p) is not None else ""]
    return ", ".join(x for x in parts if x)


def _verdict(ok: bool | None) -> str:
    return "–" if ok is None else ("met" if ok else "MISSED")


def fit_text(line: dict[str, Any] | None, unit: str = "s", scale: float = 1000, per: str = "ms") -> str:
    """`12 ms/node + 0.41 s (r² 0.99)`: a least-squares line against N."""
    if not line:
        return ""
    return f"{line['per_node'] * scale:.{0 if scale != 1 else 2}f} {per}/node {signed(line['fixed'], unit)} " \
           f"(r² {line['r2']:.2f})"


def signed(value: float, unit: str) -> str:
    """`+ 0.50 s`, `− 0.23 s` (never `+ -0.23`)."""
    return f"{'−' if round(value, 2) < 0 else '+'} {abs(value):.2f} {unit}".rstrip()


def fanout_rows(fan: dict[str, Any], cell: Cell) -> list[list[str]]:
    out = []
    for r in fan["rows"]:
        out.append(["fan-out, light cmd", str(r["nodes"]), cell(r["launcher"]), cell(r["ssh_loop"]),
                    cell(r.get("pdsh")), "", _ratios(r, "launcher_over_a", "launcher_over_p"),
                    f"≤ {target_plain(r['nodes']):.2f}x (a)", _verdict(r["launcher_ok"])])
        if "launcher_preflight" in r:
            out.append(["fan-out + preflight", str(r["nodes"]), cell(r["launcher_preflight"]), cell(r["ssh_loop"]),
                        cell(r.get("pdsh")), "", f"{r['preflight_over_a']:.2f}x (a)", "≤ 1.25x (a)",
                        _verdict(r["preflight_ok"])])
    fits = fan.get("fits") or {}
    if fits:
        sizes = [r["nodes"] for r in fan["rows"]]
        label = f"fan-out: cost per node (least squares, N = {min(sizes)}–{max(sizes)})"
        out.append([label, "", fit_text(fits.get("launcher", {}).get("seconds")),
                     fit_text(fits.get("ssh_loop", {}).get("seconds")), fit_text(fits.get("pdsh", {}).get("seconds")),
                     "", "", "(figure only)", "–"])
        out.append(["fan-out: CPU per node (least squares)", "",
                    fit_text(fits.get("launcher", {}).get("cpu_s"), "CPU s"),
                    fit_text(fits.get("ssh_loop", {}).get("cpu_s"), "CPU s"),
                    fit_text(fits.get("pdsh", {}).get("cpu_s"), "CPU s"), "", "", "(figure only)", "–"])
        launcher = fits.get("launcher", {})
        out.append(["launcher: memory, threads, fds per node (least squares)", "",
                    f"RSS {fit_text(launcher.get('peak_rss_mb'), 'MB', 1024, 'kB')}; "
                    f"threads {fit_text(launcher.get('threads'), '', 1, '')}; "
                    f"fds {fit_text(launcher.get('fds'), '', 1, '')}",
                    "", "", "", "", "(figure only)", "–"])
    return out


def _cost(v: dict[str, Any], n: int, own_rss: bool) -> str:
    """CPU seconds (and per node), memory, processes, threads, fds of one method at N."""
    cpu = v["cpu_s"]["median"]
    rss = v["peak_rss_mb"]["median"] if own_rss else v["tree_rss_mb"]["median"]
    return (f"{cpu:.2f} CPU s ({cpu / n * 1000:.0f} ms/node); {'peak RSS' if own_rss else 'RSS, all processes'} "
            f"{rss:.0f} MB; {v['peak_processes']['median']:.0f} processes, {v['peak_threads']['median']:.0f} "
            f"threads, {v['peak_fds']['median']:.0f} fds")


def cost_rows(fan: dict[str, Any]) -> list[list[str]]:
    """The launcher's own cost at large N, against the ssh loop's (bash + N ssh) and pdsh's (pdsh + N ssh)."""
    out = []
    for r in fan["rows"]:
        if r["nodes"] not in COST_SIZES or "peak_threads" not in r["launcher"]:
            continue
        n = r["nodes"]
        out.append(["cost: CPU, memory, processes, threads, fds", str(n), _cost(r["launcher"], n, True),
                    _cost(r["ssh_loop"], n, False), _cost(r["pdsh"], n, False) if "pdsh" in r else "", "", "",
                    "(figure only)", "–"])
    return out


def doctor_rows(doc: dict[str, Any], cell: Cell, target: str) -> list[list[str]]:
    out = []
    for r in doc["rows"]:
        out.append(["doctor (run_doctor, all)", str(r["nodes"]), cell(r["doctor"]), cell(r["ssh_loop"]),
                    cell(r.get("pdsh")), "", _ratios(r, "doctor_over_a", "doctor_over_p"), target,
                    _verdict(r["doctor_ok"])])
    fits = doc.get("fits") or {}
    if fits.get("doctor"):
        out.append(["doctor: cost per node (least squares)", "", fit_text(fits.get("doctor")),
                    fit_text(fits.get("ssh_loop")), fit_text(fits.get("pdsh")), "", "", "(figure only)", "–"])
    return out


STOP_TARGETS = {16: 1.10, 64: 1.25}
"""`inv stop` against the pkill loop at these N (#25)."""


def stop_scale_rows(fig: dict[str, Any], cell: Cell) -> list[list[str]]:
    """Per N: Ctrl-C and `inv stop` against a pkill loop and pdsh pkill; the target is that nothing is left."""
    out = []
    for r in fig["rows"]:
        n = str(r["nodes"])

        def left(v: dict[str, Any]) -> str:
            return f"{v['left_total']} left" + (f", {v['timeouts']} timed out" if v["timeouts"] else "")

        sig = r["sigint"]
        out.append(["stop at scale: Ctrl-C attached", n, f"{cell(sig)}; {left(sig)}", "", "", "", "", "0 left",
                    _verdict(sig["left_total"] == 0 and sig["timeouts"] == 0 and sig["median"] is not None)])
        stop, a, p = r["inv_stop"], r["ssh_loop"], r.get("pdsh")
        ratio = [f"{stop['median'] / base['median']:.2f}x ({k})" for k, base in (("a", a), ("p", p))
                 if base and base.get("median") and stop.get("median")]
        bound = STOP_TARGETS.get(r["nodes"])
        over = stop["median"] / a["median"] if stop.get("median") and a.get("median") else None
        out.append(["stop at scale: inv stop vs a pkill loop, pdsh pkill", n, f"{cell(stop)}; {left(stop)}",
                    f"{cell(a)}; {left(a)}", f"{cell(p)}; {left(p)}" if p else "", "", ", ".join(ratio),
                    "0 left" + (f", ≤ {bound:.2f}x (a)" if bound else ""),
                    _verdict(stop["left_total"] == 0 and stop["timeouts"] == 0 and over is not None
                             and (bound is None or over <= bound))])
    fits = fig.get("fits") or {}
    if fits:
        out.append(["stop at scale: cost per node (least squares)", "",
                    f"Ctrl-C {fit_text(fits.get('sigint'))}; inv stop {fit_text(fits.get('inv_stop'))}",
                    fit_text(fits.get("ssh_loop")), fit_text(fits.get("pdsh")), "", "", "(figure only)", "–"])
    for f in fig.get("start_failures") or []:
        out.append(["stop at scale: a run that did not come up", str(f["nodes"]),
                    f"{f['way']}: " + " ".join(f["error"].split())[:160], "", "", "", "", "0 expected", "MISSED"])
    return out


SCALE_OPS = (("launcher", "fan-out, light cmd"), ("launcher_preflight", "fan-out + preflight"),
             ("doctor", "inv doctor (as typed)"), ("status", "inv status"), ("top", "inv top --once --json"),
             ("stacks", "inv stacks"), ("stop", "inv stop (until nothing is left)"))


def scale_rows(fig: dict[str, Any], cell: Cell) -> list[list[str]]:
    """The scale figure: each operation at 128/256 nodes against the ssh loop, pdsh -f N and pdsh's default."""
    out = []
    target = fig.get("target", 1.0)
    for r in fig["rows"]:
        n, over = str(r["nodes"]), r["over_a"]
        pdsh = cell(r.get("pdsh")) + (f"; -f {fig['pdsh_default_fanout']}: {cell(r['pdsh_32'])}"
                                      if "pdsh_32" in r else "")
        for key, label in SCALE_OPS:
            entry = r[key]
            shown = cell(entry) if "median" in entry else f"{entry['seconds']:.2f} s"
            if "lines" in entry:
                shown += f"; answer {entry['lines']} lines, {entry['chars']} chars, exit {entry['code']}"
            if key == "stop":
                shown += f"; {entry['left']} left"
            out.append([f"scale: {label}", n, shown, cell(r["ssh_loop"]), pdsh, "", f"{over[key]:.2f}x (a)",
                        f"≤ {target:.2f}x (a)", _verdict(over[key] <= target)])
        if "first_launch" in r:
            out.append(["scale: the first launch on fresh nodes (each compiles the agent once)", n,
                        f"{r['first_launch']['seconds']:.2f} s", cell(r["ssh_loop"]), "", "",
                        f"{r['first_launch']['seconds'] / r['ssh_loop']['median']:.2f}x (a)", "(figure only)", "–"])
        c = r["console"]
        out.append(["scale: an attached launch's console", n, f"{c['lines']} lines; last: {c['last'][-1:]}", "", "",
                    "", "", "(figure only)", "–"])
    cost = fig.get("cost") or {}
    fits = cost.get("fits") or {}
    if fits:
        sizes = [p["nodes"] for p in cost["points"]]
        out.append([f"scale: the launcher's cost per node (N = {min(sizes)}–{max(sizes)})", "",
                    f"{fit_text(fits.get('seconds'))}; CPU {fit_text(fits.get('cpu_s'), 'CPU s')}; RSS "
                    f"{fit_text(fits.get('rss_mb'), 'MB', 1000, 'kB')}; threads "
                    f"{fit_text(fits.get('threads'), '', 1, '')}; fds {fit_text(fits.get('fds'), '', 1, '')}",
                    "", "", "", "", "(figure only)", "–"])
    return out
