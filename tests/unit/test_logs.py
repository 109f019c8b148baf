"""A run's output: the node's agent merges its workers' files into one tagged log (`logmerge.LogMerger`), the
controller prefixes it in bulk (`logs.NodeLog`); on real sshd nodes, every line of a chatty job arrives once, whole
and in order per rank, live and through `inv logs`."""

from __future__ import annotations

import io

from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.report.lines import NodeLog

# --- the controller: bulk prefixes, the same text as one line at a time ------------------------------------

_LINE = st.one_of(
    st.builds(lambda tag, body: tag + body,
              st.sampled_from([b"[default0@r2]:", b"[default1@r3]:", b"[default0@r0]:", b"[default1]:", b""]),
              st.sampled_from([b"x", b"", b"a\r", b"[0]:no tag", b"\xff\xfe", b"\xc3\xa9t\xc3\xa9", b"long" * 50])),
    st.binary(max_size=30).filter(lambda b: b"\n" not in b))


def per_line(log: NodeLog) -> NodeLog:
    log._bulk = lambda block: (None, 0)  # type: ignore[method-assign]  # what NodeLog did before: line by line
    return log


@settings(max_examples=300, deadline=None)
@given(lines=st.lists(_LINE, max_size=60), cuts=st.lists(st.integers(1, 400), max_size=10), ending=st.booleans())
def test_bulk_prefixes_give_the_text_of_one_line_at_a_time(lines: list[bytes], cuts: list[int], ending: bool) -> None:
    stream = b"\n".join(lines) + (b"\n" if ending else b"")
    outs, logs = [], [NodeLog("node-1", 1, 6, 2, False), per_line(NodeLog("node-1", 1, 6, 2, False))]
    for log in logs:
        out, at = io.StringIO(), 0
        for cut in [*cuts, len(stream)]:  # arbitrary chunk boundaries, as a channel delivers them
            log.feed(stream[at:at + cut], out)
            at += cut
        log.feed(stream[at:], out)
        log.close(out)
        outs.append(out.getvalue())
    assert outs[0] == outs[1]
    assert list(logs[0].tail) == list(logs[1].tail)


# --- the agent: worker files -> one tagged log ----------------------------------------------------------------


# --- a chatty job on real nodes ---------------------------------------------------------------------------------


