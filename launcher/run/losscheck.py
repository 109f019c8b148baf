"""An attached run's loss rules (`launcher.watch.loss`) over each node's beats: each finding an event (the console
says it, the page marks it), and a non-finite loss stops the run under `--on-nonfinite stop`."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from launcher.events import LossFlagged
from launcher.watch.loss import LossWatch, NonFinite, Spike

log = logging.getLogger(__name__)


class LossCheck:
    """The loss rules over the beats, and the non-finite loss that stopped the run."""

    def __init__(self, on_nonfinite: str, nodes: Iterable[str]):
        self.watch = LossWatch(nodes=frozenset(nodes))
        self.stops = on_nonfinite == "stop"
        self.nonfinite: NonFinite | None = None
        """The non-finite loss the run was stopped for."""

    def observe(
        self,
        node: str,
        progress: Iterable[Mapping[str, Any]],
        on_event: Callable[[LossFlagged], None],
        stop: Callable[..., None],
    ) -> None:
        """One node's beat; what the rules find now, each an event, and the stop a non-finite loss asks for."""
        self.watch.feed(node, progress)
        for finding in self.watch.look(time.monotonic()):
            stops = isinstance(finding, NonFinite) and self.stops
            if stops:
                self.nonfinite = finding  # type: ignore[assignment]
            rank = None if isinstance(finding, Spike) else finding.rank
            where = "" if isinstance(finding, Spike) else finding.node
            log.info("loss: %s%s", finding.line(), " (stopping the run)" if stops else "")
            step = getattr(finding, "step", None)
            on_event(LossFlagged(where, time.time(), finding.kind, finding.line(), rank, step, stops))
            if stops:
                stop(why=f"a non-finite loss: {finding.line()}")

    def gone_nonfinite(self) -> NonFinite | None:
        """The first non-finite loss of the run so far, stopped for or not (a hang's and a failure's words)."""
        return self.watch.first_nonfinite()

    def before(self) -> str:
        """What the loss had done before a hang or a failure, as words to add to its line ("" where it stayed
        finite)."""
        bad = self.gone_nonfinite()
        if bad is None:
            return ""
        return f" (before it, the loss had gone {bad.value} at step {bad.step:,} on rank {bad.rank}, {bad.node})"
