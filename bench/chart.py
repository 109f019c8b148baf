"""The scale figures as a picture: seconds against N for each method (launcher, ssh loop, pdsh), fan-out, doctor
and stop, each point the median with its min–max as an error bar, and the least-squares line through it.

Needs matplotlib (`pip install -e '.[bench]'`); bench/run.py imports this module only when it draws, and skips the
picture with one line when matplotlib is missing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

STYLE = {  # method -> (label, colour, marker)
    "launcher": ("launcher", "tab:blue", "o"),
    "launcher_preflight": ("launcher + preflight", "tab:cyan", "s"),
    "doctor": ("launcher: run_doctor", "tab:blue", "o"),
    "sigint": ("launcher: Ctrl-C (attached)", "tab:blue", "o"),
    "inv_stop": ("launcher: inv stop (detached)", "tab:cyan", "s"),
    "ssh_loop": ("(a) ssh loop", "tab:orange", "^"),
    "pdsh": ("(p) pdsh -R ssh", "tab:green", "v"),
}


def panels(results: dict[str, Any]) -> list[tuple[str, list[dict[str, Any]], list[str], dict[str, Any]]]:
    """(title, rows, methods, fits) for each figure present in the results."""
    out = []
    fan = results.get("fanout")
    if fan and fan.get("rows"):
        out.append((f"fan-out: {fan.get('light_command', 'a light command')} on N nodes", fan["rows"],
                    ["launcher", "launcher_preflight", "ssh_loop", "pdsh"], fan.get("fits", {})))
    doc = results.get("doctor")
    if doc and doc.get("rows"):
        out.append(("doctor (all checks) vs one light command", doc["rows"], ["doctor", "ssh_loop", "pdsh"],
                    {k: {"seconds": v} for k, v in doc.get("fits", {}).items()}))
    stop = results.get("stop_scale")
    if stop and stop.get("rows"):
        out.append((f"stop: `{stop.get('job', 'sleep')}` on N nodes, until none is left", stop["rows"],
                    list(stop.get("ways", [])), {k: {"seconds": v} for k, v in stop.get("fits", {}).items()}))
    return out


def draw(results: dict[str, Any], path: Path, title: str) -> Path | None:
    """Write the picture to `path`; None when there is nothing to draw. Raises ImportError without matplotlib."""
    import matplotlib

    matplotlib.use("Agg")  # no display here; set before pyplot is imported
    import matplotlib.pyplot as plt

    todo = panels(results)
    if not todo:
        return None
    fig, axes = plt.subplots(1, len(todo), figsize=(6.2 * len(todo), 4.8), squeeze=False)
    for ax, (name, rows, methods, fits) in zip(axes[0], todo, strict=True):
        for method in methods:
            have = [r for r in rows if isinstance(r.get(method), dict) and r[method].get("median") is not None]
            if not have:
                continue
            label, colour, marker = STYLE.get(method, (method, None, "o"))
            ns = [r["nodes"] for r in have]
            med = [r[method]["median"] for r in have]
            low = [m - r[method]["min"] for m, r in zip(med, have, strict=True)]
            high = [r[method]["max"] - m for m, r in zip(med, have, strict=True)]
            line = (fits.get(method) or {}).get("seconds")
            if line:
                label += f": {line['per_node'] * 1000:.0f} ms/node {'−' if line['fixed'] < -0.005 else '+'} " \
                         f"{abs(line['fixed']):.2f} s"
                xs = [min(ns) * (max(ns) / min(ns)) ** (k / 40) for k in range(41)]  # smooth on the log axis
                ax.plot(xs, [line["fixed"] + line["per_node"] * x for x in xs], color=colour, linestyle=":",
                        linewidth=1)
            ax.errorbar(ns, med, yerr=[low, high], color=colour, marker=marker, linestyle="-", capsize=3,
                        label=label)
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted({r["nodes"] for r in rows}))
        ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.set_xlabel("nodes (N)")
        ax.set_ylabel("seconds (median, min–max)")
        ax.set_title(name, fontsize=10)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
