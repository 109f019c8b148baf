"""`inv logs --job` prints a job's output file in chunks: memory stays small whatever the file's size (#21.5)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from launcher.errors import LauncherError
from launcher.slurm import jobs
from tests.helpers import REPO

PRINT_AND_MEASURE = """
import io, os, resource, sys
from pathlib import Path
from launcher.slurm.jobs import _Tail
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
with open(os.devnull, "w") as sink:
    assert _Tail(Path(sys.argv[1]), sink).copy()
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base)
"""


def test_a_100_mb_output_file_is_printed_in_bounded_memory(tmp_path: Path) -> None:
    output = tmp_path / "slurm-7.out"
    line = b"node-0 r0  | epoch 0 step 10 loss 0.113628 samples/s 10156.5 " + b"x" * 60 + b"\n"
    with output.open("wb") as f:
        for _ in range(100):
            f.write(line * ((1 << 20) // len(line)))
    size = output.stat().st_size
    grown_kib = int(subprocess.run([sys.executable, "-c", PRINT_AND_MEASURE, str(output)], cwd=REPO, check=True,
                                   capture_output=True, text=True).stdout)
    assert size > 95 << 20
    assert grown_kib < 16 << 10, f"peak RSS grew {grown_kib} KiB printing a {size >> 20} MiB file"


def test_an_output_that_cannot_be_read_is_one_sentence(tmp_path: Path) -> None:
    folder = tmp_path / "slurm-8.out"
    folder.mkdir()  # a directory where the output file should be
    try:
        jobs._Tail(folder, sys.stdout).copy()
    except LauncherError as exc:
        assert str(exc) == f"cannot read the job's output {folder}: Is a directory"
    else:
        raise AssertionError("no error")
