"""NCCL's flight recorder for a run on GPU nodes, tested with files (this machine has no GPU): the environment the
agent gives the workers, the debug-info pipes it writes to when the launcher finds a hang first (a stand-in reads
them as torch's monitor thread does), and the dumps brought back beside the stacks with the command that reads
them."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from launcher.limits import FLIGHT_RECORDER_ENV, NODE_TIMING
from launcher.node import wire
from launcher.node.agent.recorder import DUMP_NAMES, PIPE_NAMES, PIPE_PREFIX, ask_dumps, flight_recorder_env, nccl_dumps
from launcher.node.agent.stackdump import source_lines
from launcher.node.wire import NCCL_PREFIX
from launcher.report.hangs import write_nccl
from launcher.watch.flightrec import sent_dumps


def test_the_flight_recorder_is_on_only_on_gpu_nodes_and_never_over_the_users_own(tmp_path: Path) -> None:
    env: dict[str, str] = {"PATH": "/bin"}
    assert not flight_recorder_env(str(tmp_path), env, FLIGHT_RECORDER_ENV, gpu=False)
    assert env == {"PATH": "/bin"} and not (tmp_path / "nccl").exists()
    assert flight_recorder_env(str(tmp_path), env, FLIGHT_RECORDER_ENV, gpu=True)
    assert env["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "2000" and env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    assert env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == str(tmp_path / "nccl" / NCCL_PREFIX)
    assert (tmp_path / "nccl").is_dir()
    own = {"TORCH_NCCL_TRACE_BUFFER_SIZE": "50"}
    assert not flight_recorder_env(str(tmp_path), own, FLIGHT_RECORDER_ENV, gpu=True)
    assert own == {"TORCH_NCCL_TRACE_BUFFER_SIZE": "50"}


def test_dumps_come_back_beside_the_stacks_with_the_command_that_reads_them(tmp_path: Path) -> None:
    run_dir, folder = tmp_path / "run", tmp_path / "stacks-1"
    (run_dir / "nccl").mkdir(parents=True)
    dumps = {f"{NCCL_PREFIX}0": b"\x80\x04pickle-0", f"{NCCL_PREFIX}1": b"\x80\x04pickle-1" * 10}
    for name, data in dumps.items():
        (run_dir / "nccl" / name).write_bytes(data)
    (run_dir / "nccl" / "other.txt").write_text("not a dump")
    sent = nccl_dumps(str(run_dir), 1 << 20)
    assert sorted(sent) == sorted(dumps)
    assert list(nccl_dumps(str(run_dir), 20)) == [f"{NCCL_PREFIX}0"]  # a cap on what travels
    [line] = write_nccl(folder, {"node-0": {"nccl": sent}, "node-1": "unreachable"})
    assert {p.name: p.read_bytes() for p in (folder / "nccl").iterdir()} == dumps
    assert line == (f"NCCL flight recorder: 2 dump(s) in {folder / 'nccl'}; read them with "
                    f"`torchfrtrace {folder / 'nccl'} -p {NCCL_PREFIX}`")
    assert write_nccl(tmp_path / "none", {"node-0": {"nccl": {}}}) == []


@pytest.mark.parametrize("own", ["TORCH_FR_BUFFER_SIZE", "TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_PIPE_FILE",
                                 "TORCH_NCCL_DUMP_ON_TIMEOUT"])
def test_both_names_of_each_setting_and_none_where_the_user_set_either(tmp_path: Path, own: str) -> None:
    env: dict[str, str] = {}
    assert flight_recorder_env(str(tmp_path), env, FLIGHT_RECORDER_ENV, gpu=True)
    assert env["TORCH_FR_BUFFER_SIZE"] == env["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "2000"
    assert {env[name] for name in DUMP_NAMES} == {str(tmp_path / "nccl" / NCCL_PREFIX)}
    assert {env[name] for name in PIPE_NAMES} == {str(tmp_path / "nccl" / PIPE_PREFIX)}
    users = {own: "theirs"}
    assert not flight_recorder_env(str(tmp_path), users, FLIGHT_RECORDER_ENV, gpu=True)
    assert users == {own: "theirs"}


@pytest.mark.parametrize(("version", "deprecated"), [("2.11.0+cu130", False), ("2.13.0", False), ("3.0", False),
                                                    ("2.10.1+cu128", True), ("2.5.1", True), (None, True), ("?", True)])
def test_from_torch_2_11_the_deprecated_names_are_left_out(tmp_path: Path, version: str | None,
                                                           deprecated: bool) -> None:
    # torch 2.11 on an H100 warned on every rank for each deprecated name set: TORCH_NCCL_TRACE_BUFFER_SIZE and
    # TORCH_NCCL_DEBUG_INFO_TEMP_FILE ("use TORCH_FR_BUFFER_SIZE instead"); it read the pipe's two names silently.
    env: dict[str, str] = {}
    assert flight_recorder_env(str(tmp_path), env, FLIGHT_RECORDER_ENV, True, version)
    assert env["TORCH_FR_BUFFER_SIZE"] == "2000" and env["TORCH_FR_DUMP_TEMP_FILE"]
    assert {env[name] for name in PIPE_NAMES} == {str(tmp_path / "nccl" / PIPE_PREFIX)}
    assert ("TORCH_NCCL_TRACE_BUFFER_SIZE" in env) is deprecated
    assert ("TORCH_NCCL_DEBUG_INFO_TEMP_FILE" in env) is deprecated


class StandIn:
    """What torch does with TORCH_NCCL_DEBUG_INFO_PIPE_FILE: make `<prefix><rank>.pipe`, read it without blocking
    about every `poll_s`, and write `<dump prefix><rank>` when something came."""

    def __init__(self, folder: Path, rank: int, poll_s: float = 0.05):
        self.pipe, self.dump = folder / f"{PIPE_PREFIX}{rank}.pipe", folder / f"{NCCL_PREFIX}{rank}"
        os.mkfifo(self.pipe)
        self.fd = os.open(self.pipe, os.O_RDONLY | os.O_NONBLOCK)
        self.poll_s, self.done = poll_s, threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        while not self.done.wait(self.poll_s):
            try:
                asked = os.read(self.fd, 128)
            except BlockingIOError:
                continue
            if asked:
                self.dump.write_bytes(b"dump asked through " + self.pipe.name.encode())

    def close(self) -> None:
        self.done.set()
        self.thread.join()
        os.close(self.fd)


def test_a_hung_run_is_asked_for_dumps_through_the_pipes_that_have_a_reader(tmp_path: Path) -> None:
    wire.use_timing({"timing": NODE_TIMING}, wire.AGENT_TIMING)  # as the agent does with its request
    folder = tmp_path / "nccl"
    folder.mkdir()
    readers = [StandIn(folder, 0), StandIn(folder, 1, poll_s=0.5)]  # a slower monitor thread
    os.mkfifo(folder / f"{PIPE_PREFIX}2.pipe")  # its rank is gone: nobody reads it (ENXIO), skipped at once
    (folder / f"{PIPE_PREFIX}3.pipe").write_text("not a FIFO: never written to")
    (folder / f"{NCCL_PREFIX}1").write_bytes(b"an old dump of NCCL's timeout")
    try:
        t0 = time.monotonic()
        assert ask_dumps(str(tmp_path), 5.0) == [0, 1]
        took = time.monotonic() - t0
    finally:
        for reader in readers:
            reader.close()
    assert took < 3.0, f"{took:.1f} s: it waits for the dumps, not for its limit"
    assert (folder / f"{NCCL_PREFIX}0").read_bytes() == f"dump asked through {PIPE_PREFIX}0.pipe".encode()
    assert (folder / f"{NCCL_PREFIX}1").read_bytes() == f"dump asked through {PIPE_PREFIX}1.pipe".encode()
    assert (folder / f"{PIPE_PREFIX}3.pipe").read_text() == "not a FIFO: never written to"
    assert not (folder / f"{NCCL_PREFIX}2").exists()
    sent: dict = {}
    assert sorted(nccl_dumps(str(tmp_path), 1 << 20, sent)) == [f"{NCCL_PREFIX}0", f"{NCCL_PREFIX}1"]  # no FIFO
    assert nccl_dumps(str(tmp_path), 1 << 20, sent) == {}  # sent already, as they are
    assert ask_dumps(str(tmp_path / "none"), 5.0) == []


def test_the_command_allows_incomplete_ranks_when_a_listed_rank_has_no_dump(tmp_path: Path) -> None:
    workers = [{"rank": 0}, {"rank": 1}]
    answers = {"node-0": {"workers": workers[:1], "nccl": {f"{NCCL_PREFIX}0": "ZHVtcA=="}},
               "node-1": {"workers": workers[1:], "nccl": {}}}
    [line] = write_nccl(tmp_path / "a", answers)
    assert line.endswith(f"-p {NCCL_PREFIX} --allow-incomplete-ranks`")
    answers["node-1"]["nccl"] = {f"{NCCL_PREFIX}1": "ZHVtcA=="}
    [line] = write_nccl(tmp_path / "b", answers)
    assert line.endswith(f"-p {NCCL_PREFIX}`")


def test_the_agent_reads_each_frames_line_from_the_file_on_the_node(tmp_path: Path) -> None:
    script = tmp_path / "job.py"
    script.write_text("import time\n\ntime.sleep(600)  # the odd one out\n")
    stack = f'Current thread 0x1 (most recent call first):\n  File "{script}", line 3 in <module>\n'
    assert source_lines(stack)[0] == {f"{script}:3": "time.sleep(600)  # the odd one out"}


def test_a_frames_line_comes_from_the_runs_copy_when_the_file_changed_after_the_rank_started(tmp_path: Path) -> None:
    # issue 69 (12): people edit the script while it trains; the line now at :3 is not the one the rank runs.
    import os
    import time

    from launcher.node.agent.stackdump import keep_script, kept_sources

    script, run_dir = tmp_path / "job.py", tmp_path / "run"
    script.write_text("import time\n\ntime.sleep(600)  # the odd one out\n")
    os.utime(script, (time.time() - 60, time.time() - 60))
    keep_script(str(run_dir), str(tmp_path), "job.py")
    started = time.time() - 30  # the rank started after the copy, before the edit
    script.write_text("# a comment added\nimport time\nprint('edited')\ntime.sleep(600)\n")
    stack = f'Current thread 0x1 (most recent call first):\n  File "{script}", line 3 in <module>\n'
    linecache_said = source_lines(stack)[0]  # no start time: the file as it is now
    assert linecache_said == {f"{script}:3": "print('edited')"}
    assert source_lines(stack, started, kept_sources(str(run_dir))) == (
        {f"{script}:3": "time.sleep(600)  # the odd one out"}, {})
    assert source_lines(stack, started, {}) == ({}, {str(script): "changed since the rank started"})


def test_a_dump_that_is_not_base64_is_neither_kept_nor_read(tmp_path: Path) -> None:
    answers = {"node-0": {"workers": [{"rank": 0}], "nccl": {f"{NCCL_PREFIX}0": "ZHVtcA==", f"{NCCL_PREFIX}1": "%%"}}}
    dumps = sent_dumps(answers)
    assert dumps == {f"{NCCL_PREFIX}0": b"dump"}
    [line] = write_nccl(tmp_path, answers, dumps)
    assert [p.name for p in (tmp_path / "nccl").iterdir()] == [f"{NCCL_PREFIX}0"]
    assert "1 dump(s)" in line
    [again] = write_nccl(tmp_path / "again", answers)  # decoded by write_nccl itself: the same
    assert again == line.replace(str(tmp_path), str(tmp_path / "again"))
