"""NCCL's flight recorder for a run on GPU nodes, tested with files (this machine has no GPU): the environment the
agent gives the workers, and the dumps brought back beside the stacks with the command that reads them."""

from __future__ import annotations

from pathlib import Path

from launcher.limits import FLIGHT_RECORDER_ENV
from launcher.node.stacks import NCCL_PREFIX, flight_recorder_env, nccl_dumps
from launcher.report.hangs import write_nccl


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
