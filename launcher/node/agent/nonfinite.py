"""A detached run's own stop for a non-finite loss (stdlib only, Python 3.8+): no launcher follows a detached run, so
with `--on-nonfinite stop` its supervisor reads its ranks' records twice a second (launcher/node/agent/records.py
`went_nonfinite`) and stops its part of the run when one says its loss went NaN or infinite, the stop's record saying
why (launcher/node/agent/runner.py `stop_run`: the page and `status` say it). In data parallelism the all-reduce
carries a NaN to every rank within a step, so every node stops its own; a node whose ranks stay finite sees its
peers go, as when any node's part ends.
"""

import threading
import time

from launcher.node.agent import trace
from launcher.node.agent.records import record_pids, went_nonfinite
from launcher.node.common import bounds
from launcher.node.common.proc import rank_processes


def words(record, rank):
    """A non-finite loss in a sentence: `rank 1's loss was nan at step 40 (its last finite: 0.03155 at step 39)`."""
    before = (
        "its last finite: %.4g at step %d" % (record["good"], record["good_step"])
        if record["good_step"]
        else "no finite loss before it"
    )
    who = "rank %s's" % rank if rank is not None else "a rank's"
    return "%s loss was %s at step %d (%s)" % (who, "%g" % record["bad"], record["bad_step"], before)


def watch(run_dir, request, proc, stop):
    """Start the thread: until torchrun ends, `stop(why)` once a rank's loss went non-finite (in the thread: the
    caller joins it once torchrun ended, so that the stop's record is whole before the supervisor exits)."""

    def look():
        told, ranks, asked = set(), {}, set()
        while proc.poll() is None:
            pids = record_pids(run_dir)
            if not pids <= asked:  # a worker's first record: its rank, while it lives (a NaN may end it first)
                asked |= pids
                ranks.update({pid: rank for pid, _, rank, _, _ in rank_processes(request["mark"])[0]})
            found = went_nonfinite(run_dir, told, pids)
            if found:
                pid, record = min(found, key=lambda item: item[1]["bad_step"])
                why = words(record, ranks.get(pid))
                trace.note("a non-finite loss (--on-nonfinite stop): %s; stopping this node's part", why)
                stop(why)
                return
            time.sleep(bounds.NONFINITE_LOOK_S)

    thread = threading.Thread(target=look, daemon=True, name="nonfinite")
    thread.start()
    return thread
