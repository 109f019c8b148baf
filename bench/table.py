"""The bench's table: one row per figure and N, from the figures' results (`python -m bench.run` renders it), in
the terminal and as markdown."""

from __future__ import annotations

import sys
from typing import Any

from bench import job as job_fig
from bench import scale_table
from bench.common import stats


def cell(s: dict[str, Any] | None, unit: str = "s", digits: int = 2) -> str:
    if not s or s.get("median") is None:
        return "–"
    return f"{s['median']:.{digits}f} ({s['min']:.{digits}f}–{s['max']:.{digits}f}) {unit}"


def verdict(ok: bool | None) -> str:
    return "–" if ok is None else ("met" if ok else "MISSED")


def failed_row(out: list[list[str]], label: str, figure: dict[str, Any]) -> None:
    """A row for launches that failed and were retried (the figure itself is from the runs that worked)."""
    failed = figure.get("failed_launches") or []
    if failed:
        last = " ".join(failed[-1]["stderr_tail"].split())[-200:]
        with_preflight = sum(bool(f.get("preflight")) for f in failed)
        out.append([f"{label}: failed launches (retried)", ",".join(sorted({str(f["nodes"]) for f in failed})),
                    f"{len(failed)} failed" + (f" ({with_preflight} with preflight)" if with_preflight else "")
                    + f"; last: {last}", "", "", "", "0 expected", "MISSED"])


def rows(results: dict[str, Any]) -> list[list[str]]:
    """[figure, N, launcher, (a) ssh loop, (d) floor, ratio, target, verdict]"""
    out: list[list[str]] = []
    fan = results.get("fanout")
    if fan:
        out += scale_table.fanout_rows(fan, cell)
        failed_row(out, "fan-out", fan)
    job_rows(out, results.get("job"))
    doc = results.get("doctor")
    if doc:
        out += scale_table.doctor_rows(doc, cell, "≤ 1.5x (a)")
    stop_rows(out, results.get("stop"))
    logs_rows(out, results.get("logs"))
    if results.get("stop_scale"):
        out += scale_table.stop_scale_rows(results["stop_scale"], cell)
    cpu = results.get("cpu")
    if cpu:
        out.append(["launcher CPU, peak RSS", str(cpu["nodes"]),
                    f"{cell(cpu['launcher_cpu_s'], 'CPU s')}; peak RSS {cell(cpu['launcher_peak_rss_mb'], 'MB', 0)}",
                    f"{cell(cpu['ssh_loop_cpu_s'], 'CPU s')} (bash + {cpu['nodes']} ssh clients)",
                    "", "", "", "(figure only)", "–"])
    if fan:
        out += scale_table.cost_rows(fan)
    failure_rows(out, results.get("failures"))
    reconnect_rows(out, results.get("reconnect"))
    elastic_rows(out, results.get("elastic"))
    recover_rows(out, results.get("recover"))
    hang_rows(out, results.get("hang"))
    top_rows(out, results.get("top"))
    startup_rows(out, results.get("startup"))
    container_rows(out, results.get("container"))
    if results.get("scale"):
        out += scale_table.scale_rows(results["scale"], cell)
    for row in (results.get("net") or {}).get("rows", []):
        out.append(["doctor --net (fresh process)", str(row["nodes"]), cell(stats(row["doctor_s"])), "", "", "", "",
                    "(figure only)", "–"])
        out.append([f"doctor --net all_reduce Gbit/s at {row['at_bytes'] >> 20} MiB", str(row["nodes"]),
                    cell(stats(row["doctor_gbps"]), "Gbit/s"), f"by hand {cell(stats(row['by_hand_gbps']), 'Gbit/s')}",
                    "", "", f"{row['ratio']:.2f}x", "(figure only)", "–"])
    if results.get("sync"):
        from bench import sync_fig

        out += sync_fig.rows(results["sync"], cell)
    # Rows of figures without a pdsh baseline have 8 cells: an empty (p) cell goes in after (a).
    return [row if len(row) == len(HEADER) else [*row[:4], "", *row[4:]] for row in out]


def job_rows(out: list[list[str]], job: dict[str, Any] | None) -> None:
    """The real job at each size: the launcher against the ssh loop and local torchrun."""
    if not job:
        return
    for r in job["rows"]:
        out.append(["real job (ddp.py 20 steps)", str(r["nodes"]), cell(r["launcher"]), cell(r["ssh_loop"]),
                    cell(r["local"]), f"{r['launcher_over_a']:.2f}x (a), {r['launcher_over_d']:.2f}x (d)",
                    f"≤ {job_fig.TARGET:.2f}x (a)", verdict(r["launcher_ok"])])
        first, loop = r["launcher"].get("first_step_s"), r["ssh_loop"].get("first_step_s")
        if first and loop:  # the run's page's headline figure, measured from the job's own lines under both
            out.append(["command -> first optimizer step, every rank", str(r["nodes"]), cell(first), cell(loop), "",
                        f"{first['median'] / loop['median']:.2f}x (a)", "", ""])
        if r.get("page_on_over_off_paired"):  # the run's page is written after the command returns
            out.append(["real job, the run's page off", str(r["nodes"]), cell(r["launcher_page_off"]), "", "",
                        f"page on / off {r['page_on_over_off_paired']:.2f}x (paired)", f"≤ {job_fig.TARGET:.2f}x",
                        verdict(r["page_on_over_off_paired"] <= job_fig.TARGET)])
        if "launcher_skip_doctor" in r:
            out.append(["real job, --skip-doctor", str(r["nodes"]), cell(r["launcher_skip_doctor"]),
                        cell(r["ssh_loop"]), cell(r["local"]), f"{r['skip_doctor_over_a']:.2f}x (a)",
                        f"≤ {job_fig.TARGET:.2f}x (a)", verdict(r["skip_doctor_over_a"] <= job_fig.TARGET)])
    failed_row(out, "real job", job)


def container_rows(out: list[list[str]], box: dict[str, Any] | None) -> None:
    """The job in a container image against the same job bare, on the same nodes."""
    if not box or "skipped" in box:
        return
    from bench import container

    out.append(["in a container: command -> first step", str(box["nodes"]), cell(box["container"]["first_step_s"]),
                f"bare {cell(box['bare']['first_step_s'])}", "", f"{box['first_step_ratio']:.2f}x bare",
                f"≤ {container.TARGET:.2f}x", verdict(box["ok"])])
    out.append(["in a container: the whole launch", str(box["nodes"]), cell(box["container"]),
                f"bare {cell(box['bare'])}", "", f"{box['wall_ratio']:.2f}x bare", "", "(figure only)"])


def stop_rows(out: list[list[str]], stop: dict[str, Any] | None) -> None:
    """Stopping a run: Ctrl-C attached, inv stop detached, and Ctrl-C on the ssh loop."""
    if not stop:
        return
    floor = stop.get("local_sigterm")
    floor_cell = f"{cell(floor)} (SIGTERM to local torchruns)" if floor else ""
    for key, label in (("sigint", "stop: Ctrl-C attached"), ("inv_stop", "stop: inv stop, detached")):
        s = stop[key]
        out.append([label, str(stop["nodes"]), cell(s) + f"; {s['left_total']} left, {s['timeouts']} timed out; "
                    f"first process gone at {cell(s['first_gone'])}", "", floor_cell, "", "≤ 2 s, 0 left",
                    verdict(stop[f"{key}_ok"])])
    failed = stop.get("start_failures") or []
    if failed:
        first = " ".join(failed[0]["error"].split())[:160]
        out.append(["stop: runs that did not come up", str(stop["nodes"]),
                    f"{len(failed)} ({', '.join(sorted({f['way'] for f in failed}))}), retried; first: {first}",
                    "", "", "", "0 expected", "MISSED"])
    a = stop["ssh_loop_sigint"]
    out.append(["stop: (a) Ctrl-C on ssh loop", str(stop["nodes"]), "",
                f"{a['left']['median']:.0f} of {a['remote_before']['median']:.0f} remote procs left after "
                f"{a['watched_s']:.0f} s (min {a['left']['min']:.0f}, {len(a['left']['runs'])} runs); "
                f"{a['ssh_clients_left']['median']:.0f} ssh clients left running", "", "", "",
                "–"])


def logs_rows(out: list[list[str]], logs: dict[str, Any] | None) -> None:
    """Replaying a big log: the launcher against the ssh loop and the floor; its output check."""
    if not logs:
        return
    lines_note = "every line once, whole, in order" if logs["lines_ok"] else f"LINES BAD: {logs['line_problems']}"
    out.append([f"logs: {logs['total_lines']:,} lines, 2 nodes", "2",
                f"{cell(logs['launcher'])}; launcher process "
                f"{logs['launcher_controller_cpu_s']['median']:.1f} CPU s",
                cell(logs.get("ssh_loop")) if "ssh_loop" in logs else "", cell(logs["local"]),
                f"{logs['launcher_over_floor']:.2f}x (d)" + (
                    f", {logs['launcher_over_a']:.2f}x (a); (a) {logs['ssh_loop_over_floor']:.2f}x (d)"
                    if "launcher_over_a" in logs else ""), "≤ 1.10x (d)", verdict(logs["launcher_ok"])])
    out.append(["logs: launcher's output check", "2", lines_note, "", "", "", "", "–"])
    failed_row(out, "logs", logs)
    if "local_tee" in logs:
        out.append(["logs: (d) with --tee 3 (diagnostic)", "2", "", "", cell(logs["local_tee"]),
                    f"launcher {logs['launcher_over_floor_tee']:.2f}x this", "", "–"])


def failure_rows(out: list[list[str]], fig: dict[str, Any] | None) -> None:
    """One row per failure mode: time until nothing of the run is left, the launcher's exit, what stayed."""
    if not fig:
        return
    n = str(fig["nodes"])
    for s in fig["modes"].values():
        codes = ",".join("none" if c is None else str(c) for c in s["codes"])
        if s["launcher_survives"]:
            exit_part = f"launcher exit {codes} at {cell(s['launcher_exit'])}"
            if s["launcher_not_exited"]:
                exit_part += f" ({s['launcher_not_exited']} still running after {fig['cap_s']:.0f} s)"
        else:
            exit_part = f"launcher killed ({codes})"
        left = f"{s['left_total']} left" + (f", {s['timeouts']} over {fig['cap_s']:.0f} s" if s["timeouts"] else "")
        out.append([f"failure: {s['label']}", n, f"all gone {cell(s['gone'])}; {exit_part}; {left}", "", "",
                    f"gone − exit {cell(s['gone_after_exit'])}" if s["gone_after_exit"]["median"] is not None
                    else "", s["target"], verdict(s["ok"])])
    failed = fig.get("start_failures") or []
    if failed:
        first = " ".join(failed[0]["error"].split())[:160]
        out.append(["failure: runs that did not come up", n,
                    f"{len(failed)} ({', '.join(sorted({f['way'] for f in failed}))}), retried; first: {first}",
                    "", "", "", "0 expected", "MISSED"])


def reconnect_rows(out: list[list[str]], fig: dict[str, Any] | None) -> None:
    """A dropped connection to the stream flowing again (bench/reconnect.py), and what the run kept."""
    if not fig:
        return
    kept = f"{fig['ticks']} ticks: {len(fig['lost'])} lost, {len(fig['twice'])} twice; {fig['left']} left"
    out.append(["dropped connection -> stream flowing again", "2",
                f"{cell(fig['flowing'])} ({fig['drops']} drops); the launcher's own: {cell(fig['reconnect_said'])}; "
                f"{kept}", "", "", "", f"≤ {fig['target_s']:g} s, none lost or twice", verdict(fig["ok"])])


def recover_rows(out: list[list[str]], fig: dict[str, Any] | None) -> None:
    """From a hang's start to training again after `--on-hang restart` (bench/recover.py), and where the time went."""
    if not fig:
        return
    parts = fig["parts"]
    went = "; ".join(f"{label} {cell(parts[key])}" for key, label in (
        ("verdict_s", "timeout + the looks"), ("stop_s", "stop"), ("between_s", "between attempts"),
        ("start_to_step_s", "start -> first step")))
    out.append([f"hang -> training again (--on-hang restart, --hang-timeout {fig['hang_timeout_s']:g})",
                str(fig["nodes"]), f"{cell(fig['back'])}: {went}", "", "", "",
                f"≤ timeout + 20 s ({fig['target_s']:g} s)", verdict(fig["ok"])])


def elastic_rows(out: list[list[str]], fig: dict[str, Any] | None) -> None:
    """Time from a node's death to training resumed on the two nodes left (3-node runs, bench/elastic.py)."""
    if not fig:
        return
    labels = {"retry": "node death -> resumed: static, --retries 1 (relaunch)",
              "c10d": "node death -> resumed: c10d 2:3, max_restarts 1 (torchrun)"}
    for mode, label in labels.items():
        s = fig.get(mode)
        if s:
            out.append([label, "3", f"{cell(s['resumed_s'])}; {s['left']} left", "", "", "", "(figure only)", "–"])


def hang_rows(out: list[list[str]], fig: dict[str, Any] | None) -> None:
    """From the hang bound to the answer, `inv stacks`, and what the watch costs (bench/hang.py)."""
    if not fig:
        return
    for row in fig["rows"]:
        n = str(row["nodes"])
        answer = [a for a in row["answer_s"] if a is not None]
        missed = len(row["answer_s"]) - len(answer)
        out.append(["hang: bound -> grouped answer", n, cell(stats(answer)) + (f"; {missed} missed" if missed else ""),
                    "", "", "", "(figure only)", verdict(not missed)])
        out.append(["hang: inv stacks (fresh process)", n, cell(stats(row["stacks_s"])), "", "", "",
                    "within a few s", "–"])
    job = fig["job"]
    out.append(["hang watch: ddp.py 2x2 wall, on", "2", cell(stats(job["watch_on_s"])), "", "",
                f"off {cell(stats(job['watch_off_s']))}", f"{job['ratio']:.3f}x", "<= 1.02x",
                verdict(job["ratio"] <= 1.02)])
    on = [c for c in job["agent_cpu_on"] if c is not None]
    off = [c for c in job["agent_cpu_off"] if c is not None]
    out.append(["hang watch: agent CPU s per s, on", "2", cell(stats(on), "CPU s/s", 4), "", "",
                f"off {cell(stats(off), 'CPU s/s', 4)}", "", "(figure only)", "–"])


def top_rows(out: list[list[str]], fig: dict[str, Any] | None) -> None:
    """What a live view costs the nodes and a real job (bench/top.py)."""
    if not fig:
        return
    for n, frames in fig.get("first_frame_s", {}).items():
        out.append(["top: first frame, every node's figures", n, cell(stats(frames)), "", "", "", "",
                    "(figure only)", "–"])
    out.append(["top: view agent CPU s per s of view", "2", cell(stats(fig["view_cpu_per_s"]), "CPU s/s", 4), "",
                "", "", "", "(figure only)", "–"])
    out.append(["top: inv top --once --json (fresh process)", "2", cell(stats(fig["once_s"])), "", "", "", "",
                "(figure only)", "–"])
    job = fig["job"]
    out.append(["top: ddp.py 2x2 wall, viewed", "2", cell(stats(job["viewed_s"])), "", "",
                f"alone {cell(stats(job['alone_s']))}", f"{job['ratio']:.3f}x", "<= 1.02x",
                verdict(job["ratio"] <= 1.02)])


def startup_rows(out: list[list[str]], fig: dict[str, Any] | None) -> None:
    """The controller's own cost per phase, and a launch's estimate where nodes have their own CPUs."""
    if not fig:
        return
    for n, row in fig["rows"].items():
        phases = (f"start {row['start_s']:.2f} s ({row['start_cpu_s']:.2f} CPU s), connect {row['connect_s']:.2f} s "
                  f"({row['connect_cpu_s']:.2f}), sessions {row['sessions_s']:.2f} s ({row['sessions_cpu_s']:.2f}), "
                  f"exit {row['exit_s']:.2f} s; peak {row['rss_mb']:.0f} MB")
        out.append(["startup: the controller's phases (its CPU)", n, phases, "", "",
                    f"here {row['wall_s']:.2f} s; nodes with own CPUs ~{row['cluster_estimate_s']:.2f} s", "",
                    "(figure only)", "–"])
    memory = fig["agent_memory"]
    out.append(["startup: a node's own time (N = 1); an agent's peak memory", "1",
                f"{fig['node_own_s']:.2f} s; agent {memory['median_mb']:.1f} MB (max {memory['max_mb']:.1f})", "", "",
                "", "", "(figure only)", "–"])


HEADER = ["figure", "N", "launcher: median (min–max)", "(a) ssh loop", "(p) pdsh -R ssh -f N",
          "(d) floor: local, no SSH", "ratio", "target", ""]


def print_table(table_rows: list[list[str]], title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    for name in HEADER:
        table.add_column(name, overflow="fold")
    for row in table_rows:
        style = "red" if row[-1] == "MISSED" else None
        table.add_row(*row, style=style)
    Console(width=None if sys.stdout.isatty() else 220).print(table)


def markdown(table_rows: list[list[str]], command: str, when: str, info: dict[str, Any], wall_s: float) -> str:
    def esc(text: str) -> str:
        return text.replace("|", "\\|")

    lines = [f"Benchmarks: `{command}` on {when} ({info['cpus']} CPUs, Python {info['python']}, "
             f"load average at start {info['loadavg'][0]:.1f}; took {wall_s:.0f} s).",
             "Times are the median of the runs with (min–max); baselines measured in the same run.", "",
             "| " + " | ".join(h or "verdict" for h in HEADER) + " |",
             "|" + "|".join("---" for _ in HEADER) + "|"]
    lines += ["| " + " | ".join(esc(c) for c in row) + " |" for row in table_rows]
    return "\n".join(lines) + "\n"
