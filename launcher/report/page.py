"""The run's page (`logs/<run id>/report.html`): launcher.report.pagedata's `Page` as one self-contained HTML file
that opens offline and reads without JavaScript: tables always, charts where matplotlib is installed (the `report`
extra), drawn as inline SVG; without it, one line says what to install.
"""

from __future__ import annotations

import html
import io
import re
import time
from collections.abc import Sequence
from typing import Any

from launcher.limits import REPORT_MAX_ROWS
from launcher.report.pagedata import PHASES, Mark, Page, end_rows
from launcher.report.pageseries import band, mark_labels, timeline_left
from launcher.report.pyplot import pyplot, release_fonts
from launcher.watch.loss import loss_text

INSTALL = "pip install matplotlib"
COLOURS = (
    "#8da0cb",
    "#a6d854",
    "#b3b3b3",
    "#66c2a5",
    "#80b1d3",
    "#ffd92f",
    "#e78ac3",
    "#cab2d6",
    "#fc8d62",
    "#e5c494",
    "#1b9e77",
)
"""One colour a phase of the start, in PHASES' order (the time before that phase)."""
MARK_COLOURS = {
    "hang": "#d62728",
    "hang-ruled-out": "#ff9896",
    "loss": "#e377c2",
    "straggler": "#ff7f0e",
    "left": "#9467bd",
    "spare": "#bcbd22",
    "stop": "#7f7f7f",
    "restart": "#17becf",
    "end": "#000000",
}
"""A colour a kind of mark; any other kind (one a newer launcher's journal holds) is drawn in OTHER_MARK."""
OTHER_MARK = "#333333"
STYLE = """body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:1200px;padding:0 1em;color:#222}
h1{font-size:1.4em}h2{font-size:1.15em;margin-top:2em;border-bottom:1px solid #ccc}
.headline{font-size:1.15em;font-weight:600;background:#f4f6fb;padding:.6em .8em;border-left:4px solid #8da0cb}
table{border-collapse:collapse;margin:.6em 0;font-size:13px}td,th{border:1px solid #ddd;padding:2px 6px;
text-align:right}td:first-child,th:first-child,td.text{text-align:left}td:first-child{white-space:nowrap}pre{background:#f7f7f7;padding:.6em;
overflow-x:auto;white-space:pre-wrap}.note{color:#555}svg{max-width:100%;height:auto}"""


def render(page: Page, charts: bool = True) -> str:
    """The whole page; `charts` false (or no matplotlib) gives the tables alone, with the line that says why."""
    plt = pyplot() if charts else None
    parts = [
        f"<!DOCTYPE html><html lang=en><head><meta charset=utf-8><title>run {_e(page.run_id)}</title>"
        f"<style>{STYLE}</style></head><body>",
        f"<h1>run {_e(page.run_id)}</h1>",
        f"<p class=headline>{_e(page.headline)}</p>",
        f"<p class=headline>{_e(page.learning)}</p>" if page.learning else "",
        _facts(page),
        *(f"<p class=note>{_e(note)}</p>" for note in page.notes),
    ]
    if plt is None:
        parts.append(
            f"<p class=note>No charts: matplotlib is not installed here ({_e(INSTALL)} draws them); the "
            "tables hold the same figures.</p>"
        )
    parts += [
        "<h2>1. The start</h2>",
        _figure(plt, _waterfall, page),
        _start_table(page),
        "<h2>2. The run</h2>",
        _figure(plt, _timeline, page),
        _marks_table(page),
        _ranks_table(page),
        "<h2>3. The end</h2>",
        _end(page),
        _attempts(page),
        "</body></html>",
    ]
    if plt is not None:
        release_fonts()
    return "\n".join(p for p in parts if p)


def _attempts(page: Page) -> str:
    """Every attempt of the launch, a line each, where there was more than one."""
    if len(page.attempts) < 2:
        return ""
    took = "" if page.launch_s is None else f", {page.launch_s:.1f} s in all"
    return (
        f"<h2>4. The attempts</h2><p>This run is one of the {len(page.attempts)} attempts of its launch{took}:"
        "</p><ul>" + "".join(f"<li>{_e(line)}</li>" for line in page.attempts) + "</ul>"
    )


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _facts(page: Page) -> str:
    start = page.first_step_s
    took = page.duration_s
    share = f" ({100 * start / took:.0f}% of it starting)" if start is not None and took else ""
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(page.command_start)) if page.command_start else "?"
    if page.never:
        ended = "never started: nothing ran"
    else:
        ended = f"took {took:.1f} s{share}" if took is not None else "still running or unknown"
        if len(page.attempts) > 1:  # the launch's time is the attempts' (section 4)
            whole = "" if page.launch_s is None else f", the launch {page.launch_s:.1f} s"
            ended = f"this attempt {ended}{whole} over {len(page.attempts)} attempts"
    stopped = re.match(r"stopped by [^,:]*?(?= at |,|:|$)", page.stopped) if page.stopped else None
    said = [stopped.group()] if stopped else []
    if page.headline.startswith("stopped on a "):  # the launcher stopped it for a hang or a stall (pagedata.hang_said)
        said = [page.headline.split(":", 1)[0]]
    lines = [f"started {when}", ended, *said, f"logs: {page.logs}"]
    return "<p>" + " &middot; ".join(_e(line) for line in lines) + "</p>"


def _figure(plt: Any, draw: Any, page: Page) -> str:
    """One chart as inline SVG (no XML header: it lives inside the HTML)."""
    if plt is None:
        return ""
    fig = draw(plt, page)
    if fig is None:
        return ""
    out = io.StringIO()
    fig.savefig(out, format="svg", bbox_inches="tight", metadata={"Date": None})
    plt.close(fig)
    svg = out.getvalue()
    return "<figure>" + svg[svg.index("<svg") :] + "</figure>"


def _waterfall(plt: Any, page: Page) -> Any:
    rows = [b for b in page.bars if b.phases]
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(11, 0.8 + 0.28 * len(rows)))
    labels = []
    for y, bar in enumerate(rows):
        before = 0.0
        for name, t in bar.phases:
            colour = COLOURS[[p[0] for p in PHASES].index(name)]
            ax.barh(y, max(t - before, 0.0), left=before, color=colour, height=0.7 if bar.rank is None else 0.45)
            before = t
        labels.append(bar.node if bar.rank is None else f"  {bar.node} r{bar.rank}")
    ax.set_yticks(range(len(rows)), labels)
    ax.invert_yaxis()
    ax.set_xlabel("seconds from the command's start")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in COLOURS]
    ax.legend(
        handles,
        [f"until {p[1]}" for p in PHASES],
        loc="upper center",
        bbox_to_anchor=(0.5, -0.25 - 0.6 / len(rows)),
        ncol=5,
        fontsize=8,
        frameon=False,
    )
    if page.hidden_bars:
        ax.set_title(f"the {len(rows)} slowest nodes ({page.hidden_bars} more in the table)", fontsize=9)
    return fig


def _timeline(plt: Any, page: Page) -> Any:
    line = page.timeline
    if not line.ranks and not line.nodes:
        return None
    gpus = any(n.gpus for n in line.nodes)
    losses = [r for r in line.ranks if r.loss is not None and any(v is not None for v in r.loss.mean)]
    count = 4 + (2 if gpus else 0) + (1 if losses else 0)
    fig, axes = plt.subplots(count, 1, figsize=(11, 1.9 * count), sharex=True)
    if losses:
        _loss(axes[count - 1], losses, line.end)
    _lines(
        axes[0],
        [(f"r{r.rank}", r.step_t, r.steps_per_s) for r in line.ranks],
        line.end,
        "steps/s per rank (each from its steps' own times)",
        [f"r{r.rank} ({r.node})" for r in line.slowest()],
        steps=True,
    )
    _lines(
        axes[1],
        [(f"r{r.rank}", r.t, r.data_share) for r in line.ranks],
        line.end,
        "waiting for data (share)",
        steps=True,
    )
    _lines(
        axes[2],
        [(n.node, n.t, n.cpu_percent) for n in line.nodes],
        line.end,
        "CPU % of the ranks, per node",
        steps=True,
    )
    _lines(axes[3], [(n.node, n.t, n.mem_gib) for n in line.nodes], line.end, "memory used, GiB per node")
    if gpus:
        _lines(
            axes[4], [(f"{n.node} gpu{g[0]}", g[1], g[2]) for n in line.nodes for g in n.gpus], line.end, "GPU use %"
        )
        _lines(
            axes[5],
            [(f"{n.node} gpu{g[0]}", g[1], g[3]) for n in line.nodes for g in n.gpus],
            line.end,
            "GPU memory, GiB",
        )
    span = max(line.end, max((m.t for m in page.marks), default=0.0)) * 1.02 or 1
    _draw_marks(axes, page.marks, span)
    axes[-1].set_xlim(timeline_left(line, page.marks, span), span)
    return fig


def _draw_marks(axes: Any, marks: Sequence[Mark], span: float) -> None:
    """Each mark a dashed line through every chart, its number above the first; the axis's words say so."""
    for mark in marks:
        for ax in axes:
            ax.axvline(mark.t, color=MARK_COLOURS.get(mark.kind, OTHER_MARK), lw=1, ls="--", zorder=1)
    for t, text, kind in mark_labels(marks, span):
        axes[0].annotate(
            text,
            (t, 1.0),
            xycoords=("data", "axes fraction"),
            fontsize=7,
            color=MARK_COLOURS.get(kind, OTHER_MARK),
            ha="center",
            va="bottom",
        )
    axes[-1].set_xlabel("seconds from the command's start" + (" (dashed: the marks below, by number)" * bool(marks)))


def _loss(ax: Any, ranks: Sequence[Any], end: float) -> None:
    """Each rank's loss (the mean of its steps' between two samples), on a log scale where it spans two decades."""
    _lines(ax, [(f"r{r.rank}", r.loss.t, r.loss.mean) for r in ranks], end, "loss per rank (its steps' mean)")
    found = [v for r in ranks for v in r.loss.mean if v is not None]
    if found and min(found) > 0 and max(found) / min(found) >= 100:
        ax.set_yscale("log")
        ax.set_ylim(min(found) / 1.5, max(found) * 1.5)
        ax.set_title("loss per rank (its steps' mean; log scale)", fontsize=9, loc="left")
    elif found and min(found) < 0:  # a log-likelihood: below 0, which `_floor` would cut
        ax.set_ylim(min(found) * 1.15, max(0.0, max(found)) * 1.15 or 1)


def _lines(
    ax: Any,
    lines: Sequence[tuple[str, Sequence[float], Sequence[float | None]]],
    end: float,
    title: str,
    named: Sequence[str] = (),
    steps: bool = False,
) -> None:
    """A line each where few (`steps`: each value holds back to the point before it, as a rate over a stretch
    does); else the band (extremes, middle half, median) and the slowest ones named. Legends sit right of the
    figure, where no mark's line crosses them."""
    ax.set_title(title, fontsize=9, loc="left")
    style = "steps-pre" if steps else "default"
    if len(lines) <= REPORT_MAX_ROWS:
        for label, t, values in lines:
            ax.plot(t, [float("nan") if v is None else v for v in values], lw=1, label=label, drawstyle=style)
        _floor(ax, title)
        if 1 < len(lines) <= 16:
            ax.legend(fontsize=7, ncol=1 + len(lines) // 9, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
        return
    found = band([t for _, t, _ in lines], [tuple(v) for _, _, v in lines], end)
    if found is None:
        return
    ax.fill_between(found.t, found.low, found.high, color="#c6dbef", lw=0, label="all")
    ax.fill_between(found.t, found.q1, found.q3, color="#6baed6", lw=0, label="middle half")
    ax.plot(found.t, found.median, color="#08519c", lw=1, label="median")
    for label in named:
        short = label.split(" ")[0]
        for name, t, values in lines:
            if name == short:
                ax.plot(t, [float("nan") if v is None else v for v in values], lw=1, label=label, drawstyle=style)
    _floor(ax, title)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)


def _floor(ax: Any, title: str) -> None:
    """Every figure from 0 (a share up to 1): a small change never looks like a fall; room above the highest value
    (a flat line is not hidden in the frame's top edge, nor under the legend)."""
    ax.set_ylim(bottom=0)
    if "share" in title:
        ax.set_ylim(top=1)
    else:
        ax.set_ylim(top=ax.get_ylim()[1] * 1.15 or 1)


def _start_table(page: Page) -> str:
    head = "".join(f"<th>{_e(label)}</th>" for _, label, _ in PHASES)
    rows = []
    for bar in page.bars:
        name = bar.node if bar.rank is None else f"&nbsp;&nbsp;{_e(bar.node)} r{bar.rank}"
        cells = "".join(f"<td>{'' if bar.at(p) is None else f'{bar.at(p):.1f}'}</td>" for p, _, _ in PHASES)
        longest = bar.longest()
        said = "" if longest is None else f"{longest[1]:.1f} s in {longest[0]}"
        rows.append(
            f"<tr><td>{name if bar.rank is not None else _e(name)}</td>{cells}<td class=text>{_e(said)}</td></tr>"
        )
    more = f"<p class=note>{page.hidden_bars} faster nodes are not listed.</p>" if page.hidden_bars else ""
    return (
        f"<table><tr><th>node</th>{head}<th>longest</th></tr>{''.join(rows)}</table>{more}"
        "<p class=note>Seconds from the command's start, by this machine's clock.</p>"
    )


def _marks_table(page: Page) -> str:
    if not page.marks:
        during = "this attempt (the others: section 4)" if len(page.attempts) > 1 else "the run"
        return f"<p class=note>No hang, straggler, restart, lost node or stop during {during}.</p>"
    rows = "".join(
        f"<tr><td>{i}</td><td>{m.t:.1f}</td><td class=text>{_e(m.kind)}</td>"
        f"<td class=text>{_e(m.node or '')}</td><td class=text>{_e(m.text)}</td></tr>"
        for i, m in enumerate(page.marks, start=1)
    )
    return f"<table><tr><th>#</th><th>s</th><th>what</th><th>node</th><th>said</th></tr>{rows}</table>"


def _ranks_table(page: Page) -> str:
    ranks = page.timeline.ranks
    if not ranks:
        return (
            "<p class=note>No rank's progress was sampled (a run shorter than one sample, or from before the page).</p>"
        )
    slow = {(r.node, r.rank) for r in page.timeline.slowest()} if len(ranks) > 1 else set()
    shown = ranks if len(ranks) <= REPORT_MAX_ROWS * 4 else [r for r in ranks if (r.node, r.rank) in slow]

    def figure(value: float | None) -> str:
        return "" if value is None else f"{value:.3g}"

    columns = (  # (header, the cell, text-aligned); a column no shown rank has a value in is left out
        ("rank", lambda r: f"r{r.rank}", False),
        ("node", lambda r: r.node, True),
        ("optimizer steps", lambda r: str(r.steps or ""), False),
        ("steps/s (first step to last)", lambda r: figure(r.mean_rate()), False),
        ("waiting for data (share, while drawing batches)", lambda r: figure(r.data_mean), False),
        ("loss (last)", lambda r: "" if r.loss is None else loss_text(r.loss.last), False),
        ("loss (lowest mean)", lambda r: "" if r.loss is None else loss_text(r.loss.low), False),
        ("slowest", lambda r: "slow" if (r.node, r.rank) in slow else "", True),
    )
    cells = [[cell(r) for _, cell, _ in columns] for r in shown]
    kept = [i for i in range(len(columns)) if i < 2 or any(row[i] for row in cells)]
    head = "".join(f"<th>{_e(columns[i][0])}</th>" for i in kept)
    rows = "".join(
        "<tr>" + "".join(f"<td{' class=text' if columns[i][2] else ''}>{_e(row[i])}</td>" for i in kept) + "</tr>"
        for row in cells
    )
    return f"<table><tr>{head}</tr>{rows}</table>"


def _end(page: Page) -> str:
    rows = "".join(
        f"<tr><td>{_e(e.node)}</td><td class=text>{_e(e.state)}</td>"
        f"<td>{'' if e.exit_code is None else e.exit_code}</td>"
        f"<td>{'' if e.ended is None else f'{e.ended:.1f}'}</td>"
        f"<td class=text>{_e('; '.join(e.raised) or e.detail)}</td></tr>"
        for e in end_rows(page.exits)
    )
    if page.root_cause:
        cause = f"<pre>{_e(page.root_cause)}</pre>"
    elif page.stopped or page.never:
        said = page.stopped or f"never started: {page.never}"
        cause = f"<p>{_e(said[0].upper() + said[1:])}.</p>"
    elif any(e.state in ("exited", "stopped", "lost") for e in page.exits):
        cause = "<p>Every node ended without a failure.</p>"
    else:
        cause = "<p>No node said how the run ended (it may still run; the nodes may be out of reach).</p>"
    return (
        f"{cause}<table><tr><th>node</th><th>state</th><th>exit code</th><th>ended (s)</th>"
        f"<th>exception</th></tr>{rows}</table><p>Logs: {_e(page.logs)}</p>"
    )
