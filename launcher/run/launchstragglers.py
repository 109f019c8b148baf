"""An attached launch's stragglers: the straggler rule (`launcher.watch.straggler`) over each node's `alive` beats
(its ranks' rates and forward shares, with the watch on); a new straggler of the whole run is told once on the
console and kept in `logs/<run id>/stragglers.txt`, where `inv status` finds it (`stragglers_of`)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from launcher.report.stragglerline import straggler_line
from launcher.watch.arrival import Arrivals
from launcher.watch.straggler import StragglerWatch, lateness

STRAGGLERS_FILE = "stragglers.txt"


class LaunchStragglers:
    """The straggler rule over an attached launch's beats; each new straggler said and kept."""

    def __init__(self, factor: float, hold_s: float, path: Path, say: Callable[[str], None], arrivals: Arrivals):
        self.path = path
        """logs/<run id>/stragglers.txt (`STRAGGLERS_FILE`)"""
        self.say = say
        self.watch = StragglerWatch(factor, hold_s)
        self.arrivals = arrivals
        """The run's collectives, fed from the same beats by the hang check (`HangCheck.observe`, before a beat
        reaches here): beats carry the ranks' progress only while hangs are watched for."""
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
        late = lateness(self.arrivals, time.time())
        for found in self.watch.new(self.watch.look(time.monotonic(), merged, forward, late)):
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
        return (log_dir / run_id / STRAGGLERS_FILE).read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
