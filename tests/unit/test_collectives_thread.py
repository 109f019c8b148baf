"""The worker's collectives thread (launcher/node/worker/collectives.py) on stand-ins for torch's modules: a process
group half imported is waited for, not a reason to stop; a recorder's dump becomes the file the agent reads."""

from __future__ import annotations

import ast
import json
import pickle
import sys
import types
from pathlib import Path

import pytest

from launcher.node.worker import collectives


class HalfImported(types.ModuleType):
    """torch.distributed while the main thread is still executing it."""

    def __getattr__(self, name: str):
        raise AttributeError(f"partially initialized module 'torch.distributed' has no attribute {name!r}")


def dump(enqueued: int, completed: int, entries: int) -> bytes:
    return pickle.dumps({"pg_config": {}, "pg_status": {"0": {"last_enqueued_collective": str(enqueued),
                                                               "last_started_collective": "-1",
                                                               "last_completed_collective": str(completed)}},
                         "entries": [{"collective_seq_id": i, "profiling_name": "gloo:all_reduce", "is_p2p": False,
                                      "process_group": ("0", "default_pg"), "time_created_ns": 10**18 + i * 10**8}
                                     for i in range(1, entries + 1)]})


def test_a_process_group_module_half_imported_is_not_ready_and_ends_nothing(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "torch.distributed", HalfImported("torch.distributed"))
    assert collectives.Watcher(str(tmp_path), 1.0, 5.0, 200, 100.0, -1).ready() is False


@pytest.mark.parametrize("keep", [3, 200])
def test_a_recorders_dump_becomes_the_rank_file_with_its_group_and_last_arrivals(monkeypatch, tmp_path: Path,
                                                                                 keep: int) -> None:
    reads: list[bool] = []

    def _dump_fr_trace(full: bool, stacks: bool, only_active: bool) -> bytes:
        reads.append(full)
        return dump(12, 11, 12 if full else 0)

    monkeypatch.setitem(sys.modules, "torch._C._distributed_c10d",
                        types.SimpleNamespace(_dump_fr_trace=_dump_fr_trace))
    monkeypatch.setenv("RANK", "3")
    watcher = collectives.Watcher(str(tmp_path), 1.0, 5.0, keep, 100.0, 77)
    watcher.look(100.0)
    watcher.look(101.0)  # within arrivals_s: the groups only
    watcher.write(101.0)
    assert reads == [True, False]
    [path] = tmp_path.iterdir()
    data = json.loads(path.read_text())
    assert data["rank"] == 3 and data["start"] == 77 and data["source"] == "flight recorder" and data["why"] == ""
    assert data["groups"] == {"0": {"desc": "default_pg", "size": None, "enqueued": 12, "started": -1,
                                    "completed": 11, "in_flight": [12, "all_reduce"]}}
    arrivals = data["arrivals"]["0"]
    assert [row[0] for row in arrivals] == list(range(1, 13))[-keep:]
    assert arrivals[-1] == [12, "all_reduce", pytest.approx(1e9 + 1.2)]


def test_a_cuda_build_reads_nccls_recorder_as_an_h200_dumped_it_and_not_the_empty_gloo_one(monkeypatch,
                                                                                          tmp_path: Path) -> None:
    # What `_dump_nccl_trace(True, False, False)` and `_dump_fr_trace` returned in-process on an H200 (torch 2.11,
    # NCCL 2.28.9; tests/gpu/gpu_hang.py's probe at step 3): a CUDA build has both, the gloo one with no group.
    folder = Path(__file__).resolve().parents[1] / "data" / "collectives" / "h200-nccl-dump"
    nccl, gloo = (ast.literal_eval((folder / name).read_text()) for name in ("rank0.txt", "rank0_gloo_recorder.txt"))
    monkeypatch.setitem(sys.modules, "torch._C._distributed_c10d", types.SimpleNamespace(
        _dump_fr_trace=lambda *args: pickle.dumps(gloo), _dump_nccl_trace=lambda *args: pickle.dumps(nccl)))
    monkeypatch.setenv("RANK", "0")
    watcher = collectives.Watcher(str(tmp_path), 1.0, 5.0, 200, 100.0, 1)
    watcher.look(100.0)
    watcher.write(100.0)
    data = json.loads(next(tmp_path.iterdir()).read_text())
    assert data["source"] == "nccl flight recorder"
    assert data["groups"] == {"0": {"desc": "default_pg", "size": 2, "enqueued": 8, "started": -1, "completed": 6,
                                    "in_flight": [7, "all_reduce"]}}
    assert [row[:2] for row in data["arrivals"]["0"]][:3] == [[1, "all_gather"], [2, "broadcast"], [3, "broadcast"]]
    assert len(data["arrivals"]["0"]) == 8
