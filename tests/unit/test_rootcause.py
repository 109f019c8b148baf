"""The root-cause choice and the report, as pure functions of how each node's part ended (no network)."""

from __future__ import annotations

from launcher.events import NodeEnd
from launcher.plan.ends import first_failure, headline
from launcher.report.rootcause import run_failed

BLOCK = ("Root Cause (first observed failure):", "[0]:", "  time      : 2026-11-22_07:00:00",
         "  rank      : 3 (local_rank: 1)", "  exitcode  : 7 (pid: 123)", "=" * 20)
PEER_LOST = ("Root Cause (first observed failure):", "[0]:", "  rank      : 0 (local_rank: 0)",
             "  exitcode  : 1 (pid: 9)", "  error: Connection closed by peer", "=" * 20)


def end(node: str, t: float, **kw) -> NodeEnd:
    return NodeEnd(node, kw.pop("kind", "exited"), t, **kw)


def test_the_first_failure_by_time_that_the_launcher_did_not_cause() -> None:
    ends = [end("node-0", 5.0, exit_code=1, asked_to_stop=True), end("node-1", 3.0, exit_code=1, tail=BLOCK),
            end("node-2", 4.0, exit_code=1)]
    assert first_failure(ends).node == "node-1"


def test_a_worker_that_only_lost_its_peer_is_not_the_cause_when_another_failed() -> None:
    ends = [end("node-0", 1.0, exit_code=1, tail=PEER_LOST), end("node-1", 2.0, exit_code=1, tail=BLOCK)]
    assert first_failure(ends).node == "node-1"


def test_no_failure_no_cause_and_stopped_nodes_are_a_last_resort() -> None:
    assert first_failure([end("node-0", 1.0, exit_code=0)]) is None
    only_stopped = [end("node-0", 1.0, exit_code=143, asked_to_stop=True)]
    assert first_failure(only_stopped).node == "node-0"


def test_a_silent_node_and_a_heartbeat_timeout_are_named_as_such_not_as_exit_137() -> None:
    silent = end("node-1", 1.0, kind="silent", silent_for=30.4)
    assert headline(silent)[0] == "root cause: node-1 stopped answering (nothing for 30 s)"
    self_stop = end("node-0", 1.0, exit_code=137, stop_reason="heartbeat-timeout")
    assert self_stop.failed
    assert "no heartbeat from the launcher" in headline(self_stop)[0] and "137" not in headline(self_stop)[0]
    assert end("node-0", 1.0, exit_code=0, stop_reason="launcher-gone").failed


def test_the_workers_own_exit_code_and_rank_from_torchruns_block() -> None:
    sentence, code, rank = headline(end("node-1", 1.0, exit_code=1, tail=BLOCK))
    assert (sentence, code, rank) == ("root cause: node-1, rank 3 (local rank 1), exit code 7", 7, 3)
    assert headline(end("node-1", 1.0, exit_code=137))[:2] == ("root cause: node-1, exit code 137", 137)


def test_the_report_carries_node_rank_exit_code_and_tail() -> None:
    ends = [end("node-0", 2.0, exit_code=143, asked_to_stop=True), end("node-1", 1.0, exit_code=1, tail=BLOCK,
                                                                        errors=("the agent said so",))]
    failed = run_failed("20261122-000000-abcdef", ends, "logs: logs/x/")
    assert (failed.node, failed.rank, failed.exit_code, failed.tail) == ("node-1", 3, 7, BLOCK)
    text = str(failed).splitlines()
    assert text[0] == "run 20261122-000000-abcdef FAILED"
    assert text[1] == "root cause: node-1, rank 3 (local rank 1), exit code 7"
    assert "  the agent said so" in text
    assert "node-0: exit code 143 (stopped by the launcher)" in text and text[-1] == "logs: logs/x/"


def test_a_torchrun_that_ended_before_its_workers_is_the_cause_even_with_exit_0() -> None:
    """A node whose torchrun never completed the rendezvous while the others wait in it: exit 0 is no success."""
    early = end("node-1", 2.0, exit_code=0, before_workers=True)
    waiting = end("node-0", 3.0, exit_code=1, asked_to_stop=True)
    assert early.failed and not end("node-1", 2.0, exit_code=0).failed
    assert first_failure([waiting, early]) is early
    sentence, code, rank = headline(early)
    assert sentence == ("root cause: node-1: torchrun ended (exit code 0) before it started any worker: it never "
                        "completed the rendezvous")
    assert (code, rank) == (1, None)


FAILED_BLOCK = ("Root Cause (first observed failure):", "[0]:", "  time      : 2026-11-27_17:00:00",
                "  host      : node-1", "  rank      : 3 (local_rank: 1)", "  exitcode  : 1 (pid: 4242)",
                "  error_file: <N/A>",
                "  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html",
                "=" * 20)


def test_the_summary_says_the_exception_the_failed_rank_raised() -> None:
    """torchrun's own block has only `To enable traceback see: ...`: the rank's exception line takes its place."""
    origin = end("node-1", 1.0, exit_code=1, tail=FAILED_BLOCK,
                 raised=((0, 2, "ValueError: not this one"), (1, 3, "RuntimeError: boom at step 7")))
    other = end("node-0", 2.0, exit_code=143, asked_to_stop=True)
    failed = run_failed("20261127-170000-abcdef", [other, origin], "logs: logs/x/")
    lines = str(failed).splitlines()
    assert lines[1] == "root cause: node-1, rank 3 (local rank 1), exit code 1: RuntimeError: boom at step 7"
    assert "  exception : RuntimeError: boom at step 7" in lines and not any("To enable" in x for x in lines)
    assert "node-0: exit code 143 (stopped by the launcher)" in lines


def test_a_node_whose_own_rank_had_failed_is_not_said_stopped_by_the_launcher() -> None:
    """Two nodes' ranks raise; the launcher's stop reaches the second after its rank failed: it failed too."""
    first = end("node-1", 1.0, exit_code=1, tail=FAILED_BLOCK, raised=((1, 3, "RuntimeError: boom"),))
    own = tuple(x.replace("rank      : 3 (local_rank: 1)", "rank      : 0 (local_rank: 0)") for x in FAILED_BLOCK)
    second = end("node-0", 1.5, exit_code=1, asked_to_stop=True, tail=own, raised=((0, 0, "KeyError: 'x'"),))
    lines = str(run_failed("r", [second, first], "logs")).splitlines()
    assert "node-0: exit code 1 (failed too: KeyError: 'x')" in lines, lines
    stopped = end("node-0", 1.5, exit_code=1, asked_to_stop=True, tail=PEER_LOST)
    assert "node-0: exit code 1 (stopped by the launcher)" in str(run_failed("r", [stopped, first], "logs"))


def test_a_nodes_log_keeps_the_last_exception_line_of_each_rank() -> None:
    from launcher.report.lines import NodeLog

    log = NodeLog("node-1", 0, 6, 2, colour=False)
    log.format(b"[default1@r3]:Traceback (most recent call last):\n[default1@r3]:  File \"train.py\", line 9\n"
               b"[default1@r3]:RuntimeError: boom\n[default0@r2]:step 7 loss 0.1\nE1127 torchrun's own Error: x\n")
    assert log.raised == {1: (3, "RuntimeError: boom")}
    log.format(b"[default0@r2]:KeyError: 'x'\n" + b"[default0@r2]:gloo: connection closed by peer\n" * 60)
    assert log.raised == {1: (3, "RuntimeError: boom"), 0: (2, "KeyError: 'x'")}  # though past the 40-line tail
    # torch 2.13 puts `[rankN]: ` before each line of a traceback raised once the process group is up
    log.format(b"[default1@r3]:[rank3]: RuntimeError: rank 3 fails on purpose\n")
    assert log.raised[1] == (3, "RuntimeError: rank 3 fails on purpose")


def test_a_stop_from_another_terminal_is_no_failure() -> None:
    stopped = end("node-0", 1.0, exit_code=143, stop_reason="stopped-elsewhere")
    assert not stopped.failed and first_failure([stopped]) is None


WARNED = (b"[default1@r1]:/venv/torch/_subclasses/functional_tensor.py:368: UserWarning: Failed to initialize NumPy: "
          b"No module named 'numpy' (Triggered internally at tensor_numpy.cpp:84.)\n"
          b"[default1@r1]:  cpu = _conversion_method_template(device=torch.device(\"cpu\"))\n"
          b"[default1@r1]:rank 1 up\n")
TORCHRUN_AFTER = (b"W1128 15:57:54.402000 5896 torch/distributed/elastic/multiprocessing/api.py:1028] Sending process "
                  b"5920 closing signal SIGTERM\n"
                  + b"".join(b'  File "/venv/torch/distributed/run.py", line %d, in main\n    run(args)\n' % i
                             for i in range(15))
                  + "\n".join(("Root Cause (first observed failure):", "[0]:", "  time      : 2026-11-28_15:57:54",
                               "  host      : node-0", "  rank      : 1 (local_rank: 1)",
                               "  exitcode  : 1 (pid: 5922)", "  error_file: <N/A>",
                               "  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/"
                               "errors.html", "=" * 20, "")).encode())


def _failed(output: bytes, chunk: int = 300) -> list[str]:
    """The report of node-0's failure, its log fed as the agent's chunks come."""
    from launcher.report.lines import NodeLog

    log = NodeLog("node-0", 0, 6, None, colour=False)
    for at in range(0, len(output), chunk):
        log.format(output[at:at + chunk])
    log.format_rest()
    origin = end("node-0", 1.0, exit_code=1, tail=log.tail,
                 raised=tuple((local, rank, line) for local, (rank, line) in log.raised.items()))
    return str(run_failed("r", [origin], "logs: logs/r/")).splitlines()


def test_the_root_cause_shows_the_exception_and_where_it_was_raised_never_the_warnings() -> None:
    """A rank in a venv without numpy: torch's warnings first, then its traceback, then torchrun's 30 lines: the
    report says the exception and its frame (though far past the node's last 40 lines), no warning, no W1128 line."""
    traceback = (b"[default1@r1]:[rank1]: Traceback (most recent call last):\n"
                 b'[default1@r1]:[rank1]:   File "/work/nonumpy.py", line 7, in <module>\n'
                 b"[default1@r1]:[rank1]:     torch.zeros(2).numpy()\n"
                 b"[default1@r1]:[rank1]:     ^^^^^^^^^^^^^^^^^^^^^^\n"
                 b"[default1@r1]:[rank1]: RuntimeError: Numpy is not available\n")
    for chunk in (7, 300, 100_000):
        lines = _failed(WARNED + traceback + TORCHRUN_AFTER, chunk)
        assert lines[1] == ("root cause: node-0, rank 1 (local rank 1), exit code 1: RuntimeError: Numpy is not "
                            "available")
        at = lines.index("  exception : RuntimeError: Numpy is not available")
        assert lines[at + 1:at + 3] == ['  raised at : File "/work/nonumpy.py", line 7, in <module>',
                                        "              torch.zeros(2).numpy()"], lines
        assert not any("Warning" in x or "W1128" in x or "To enable traceback" in x for x in lines), lines


def test_a_rank_that_raised_nothing_shows_its_last_lines_that_are_not_warnings() -> None:
    lines = _failed(WARNED + b"[default1@r1]:[W1128 15:57:54.1 ProcessGroupGloo.cpp:1] Warning: slow\n"
                    + TORCHRUN_AFTER)
    at = lines.index("  last lines: (no exception)")
    assert lines[at + 1:at + 2] == ["    rank 1 up"], lines
    assert not any("Warning" in x or "cpu = " in x or "To enable traceback" in x for x in lines), lines


def test_without_torchruns_block_the_last_lines_shown_are_not_warnings() -> None:
    lines = _failed(WARNED + b"Killed\n")
    assert lines[2:] == ["  [local rank 1, rank 1] rank 1 up", "  Killed", "logs: logs/r/"], lines


def test_after_a_stop_the_user_asked_for_torchruns_lines_are_one_line_a_node() -> None:
    """Ctrl-C: torchrun's `Received 15 death signal` and its 30-line SignalException traceback stay out of the
    console, and the node's end says how many there were and where; the ranks' lines still show, the tail keeps all."""
    from launcher.report.lines import NodeLog

    log = NodeLog("node-1", 1, 6, 2, colour=False)
    before, _ = log.format(b"[default0@r2]:step 7\nW1128 torchrun's own line before the stop\n")
    assert before.splitlines() == ["node-1 r2  | step 7", "node-1     | W1128 torchrun's own line before the stop"]
    log.stop_asked("logs/r")
    stop = (b"W1128 16:28:38.323000 28673 api.py:753] Received 15 death signal, shutting down workers\n"
            b"[default0@r2]:saving a checkpoint on SIGTERM\nTraceback (most recent call last):\n"
            + b'  File "run.py", line 9, in main\n' * 28
            + b"torch.distributed.elastic.multiprocessing.api.SignalException: Process 5898 got signal: 15")
    for at in range(0, len(stop), 50):
        text, count = log.format(stop[at:at + 50])
        assert "Traceback" not in text and "death signal" not in text and count == len(text.splitlines())
    rest, count = log.format_rest()
    assert rest.splitlines() == ["node-1     | stopped as asked; torchrun's 31 line(s) on it (its signal, its "
                                 "traceback) are in logs/r/node-1.log"] and count == 1
    assert log.tail[-1].endswith("SignalException: Process 5898 got signal: 15")
    assert log.format_rest() == ("", 0)


def test_torchruns_exit_barrier_traceback_on_a_run_that_ended_well_is_one_line() -> None:
    """issue 69 (4): a node that reached torchrun's exit barrier as the store's host ended prints ~30 lines of
    `Error waiting on exit barrier` and the TCPStore's traceback, then exits 0: one line, the rest in the log."""
    from pathlib import Path

    from launcher.report.lines import NodeLog

    log = NodeLog("node-1", 1, 6, 2, colour=False, folder=Path("logs/r"))
    done, _ = log.format(b"[default0@r2]:done 2\nI1208 01:02:03.000000 999 api.py:966] Local worker group finished "
                         b"(WorkerState.SUCCEEDED). Waiting 300 seconds for other agents to finish\n")
    assert len(done.splitlines()) == 2
    barrier = (b"E1208 01:02:03.512000 999 .../torch/distributed/elastic/agent/server/api.py:1008] Error waiting on "
               b"exit barrier. Elapsed: 0.51 seconds\nTraceback (most recent call last):\n"
               + b'  File ".../torch/distributed/elastic/agent/server/api.py", line 994, in _exit_barrier\n' * 26
               + b"torch.distributed.DistNetworkError: failed to recv, got 0 bytes\n")
    text, count = log.format(barrier)
    assert text == "" and count == 0
    rest, count = log.format_rest()
    assert rest.splitlines() == ["node-1     | the exit barrier; torchrun's 29 line(s) (its store gone as the run "
                                 "ended: no failure) are in logs/r/node-1.log"] and count == 1
    plain = NodeLog("node-1", 1, 6, 2, colour=False)  # `inv logs`: no folder of the launch's, every line shown
    assert "Error waiting on exit barrier" in plain.format(barrier)[0]
