"""The doctor's output: a Rich table of marks with each problem and its fix, or JSON for scripts."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from launcher.doctor.evidence import Finding, Report, Status

# Styled spans, not a Text's base style: the colour covers the mark only, never the cell's padding.
MARKS: dict[Status, Text] = {
    "ok": Text.assemble(("✓", "green")),
    "warn": Text.assemble(("!", "yellow")),
    "fail": Text.assemble(("✗", "bold red")),
}
"""The cell of a check's worst finding on a node."""
NONE = Text.assemble(("·", "dim"))
"""The cell of a check that said nothing about a node."""
_RANK: dict[Status | None, int] = {"ok": 0, "warn": 1, "fail": 2}


def _worst(findings: Iterable[Finding]) -> Status | None:
    statuses = [f.status for f in findings]
    return max(statuses, key=lambda status: _RANK[status]) if statuses else None


def render_table(report: Report, console: Console) -> None:
    """One row per node: its probe's time, then a column per check (✓ ok, ! warn, ✗ fail); each problem and its fix.

    The inventory path, host names, details and fixes come from users and nodes: they are printed as plain `Text`,
    so a `[/]` in them prints as it is instead of being read as Rich markup.
    """
    title = Text(f"doctor: {len(report.hosts)} node(s) from {report.source}", style="table.title")
    table = Table(title=title, title_justify="left")
    table.add_column("node", no_wrap=True)
    table.add_column("probe", justify="right", no_wrap=True)
    for check in report.checks:
        table.add_column(check, justify="center", no_wrap=True, min_width=len(check))
    for host in report.hosts:
        cells = []
        for check in report.checks:
            worst = _worst(f for f in report.findings if f.host == host and f.check == check)
            cells.append(MARKS[worst].copy() if worst else NONE.copy())
        took = report.probe_times.get(host)
        table.add_row(Text(host), Text(f"{took:.1f} s") if took is not None else NONE.copy(), *cells)
    console.print(table)
    for f in report.findings:  # --net: every node's figures, not only the slow one's; an ok's note
        if f.status == "ok" and (f.check == "net" or f.note):
            console.print(Text.assemble(MARKS["ok"], f" {f.host} {f.check}: "), end="", highlight=False)
            console.print(f.detail, markup=False, highlight=False)
    for f in report.problems:
        console.print(Text.assemble(MARKS[f.status], f" {f.host} {f.check}: "), end="", highlight=False)
        console.print(f.detail, markup=False, highlight=False)
        if f.fix:
            console.print("    fix: ", end="", style="dim", highlight=False)
            console.print(f.fix, markup=False, highlight=False)
    failed = len(report.failures)
    warned = len(report.problems) - failed
    took = report.timings.get("total_s", 0.0)
    if report.ok and not warned:
        console.print(
            f"[green]all {len(report.checks)} checks passed on {len(report.hosts)} node(s)[/] in {took:.1f} s",
            highlight=False,
        )
    else:
        console.print(f"{failed} failure(s), {warned} warning(s) in {took:.1f} s", highlight=False)


def report_json(report: Report) -> str:
    """The report for scripts: ok, findings, per node its probe's answer, time (probe_s) and error, timings; with
    --net, per node its `net` figures and the group's (`net`)."""
    nodes: dict[str, dict[str, Any]] = {
        h: {"probe": report.probes.get(h), "probe_s": report.probe_times.get(h), "error": report.errors.get(h)}
        for h in report.hosts
    }
    if "net" in report.checks:
        for host, figures in nodes.items():
            figures["net"] = report.net.get(host)
    return json.dumps(
        {
            "ok": report.ok,
            "inventory": report.source,
            "checks": list(report.checks),
            "findings": [dataclasses.asdict(f) for f in report.findings],
            "nodes": nodes,
            "listener": report.listener,
            "timings": dict(report.timings),
            **({"net": dict(report.net_group)} if "net" in report.checks else {}),
        },
        indent=2,
    )
