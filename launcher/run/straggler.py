"""Stragglers of an attached launch: each node's `alive` beats carry its ranks' step rates and forward shares (with
the watch on); a rank below `straggler_factor` x the median rate, or computing well more of each step than the median
rank while the rates agree (lockstep DDP), for `straggler_hold` seconds is told once on the console and kept in
`logs/<run id>/stragglers.txt`, where `inv status` finds it."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from launcher.options import Options
from launcher.plan.straggler import StragglerWatch, straggler_line  # not report.top: a launch imports no rich

FILE = "stragglers.txt"


class LaunchStragglers:
    def __init__(self, opts: Options, run_id: str, say: Callable[[str], None]):
        self.path = opts.log_dir / run_id / FILE
        self.say = say
        self.watch = StragglerWatch(opts.straggler_factor, opts.straggler_hold)
        self.rates: dict[str, dict[int, float | None]] = {}
        self.forward: dict[str, dict[int, float | None]] = {}
        self.node_of: dict[int, str] = {}

    def beat(self, node: str, progress: Iterable[Mapping[str, Any]]) -> None:
        """One node's beat: its ranks' rates and forward shares now; any new straggler of the whole run is told."""
        progress = list(progress)
        self.rates[node] = {int(r["rank"]): r.get("steps_per_s") for r in progress}
        self.forward[node] = {int(r["rank"]): r.get("forward_share") for r in progress}
        self.node_of.update({rank: node for rank in self.rates[node]})
        merged = {rank: rate for rates in self.rates.values() for rank, rate in rates.items()}
        forward = {rank: share for shares in self.forward.values() for rank, share in shares.items()}
        for found in self.watch.new(self.watch.look(time.monotonic(), merged, forward)):
            line = straggler_line(found, self.node_of.get(found.key, "?"))  # type: ignore[call-overload]
            self.say(line)
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                with self.path.open("a", encoding="utf-8") as handle:
                    handle.write(line + "\n")
            except OSError:
                pass  # the console said it: a log folder that cannot be written is told elsewhere


def stragglers_of(log_dir: Path, run_id: str) -> list[str]:
    """The stragglers an attached launch told for a run (for `inv status`)."""
    try:
        return (log_dir / run_id / FILE).read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
