"""The baselines the launcher is measured against: (a) a bash loop of `ssh HOST CMD &` and (p) pdsh, over the
sandbox's own ssh config."""

from __future__ import annotations

import shlex
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.common import Timed, run_timed


def ssh_loop_script(ssh_config: Path, commands: Sequence[str]) -> str:
    """Baseline (a): `for i ...; do ssh -F CFG node-i "CMD_i" & done; wait` as one bash script."""
    config = shlex.quote(str(ssh_config))
    lines = [f"ssh -F {config} node-{i} {shlex.quote(cmd)} &" for i, cmd in enumerate(commands)]
    return "\n".join([*lines, "wait"])


def ssh_loop(ssh_config: Path, commands: Sequence[str], *, timeout: float = 300, stdout: Any = subprocess.PIPE,
             sample: bool = False) -> Timed:
    return run_timed(["bash", "-c", ssh_loop_script(ssh_config, commands)], timeout=timeout, stdout=stdout,
                     sample=sample)


PDSH = "pdsh"


def pdsh_argv(n: int, command: str, fanout: int | None = None) -> list[str]:
    """Baseline (p): `pdsh -R ssh -f F -w node-[0-(n-1)] CMD`; F defaults to n (all at once, like the ssh loop;
    pdsh's own default is 32)."""
    hosts = "node-0" if n == 1 else f"node-[0-{n - 1}]"
    return [PDSH, "-R", "ssh", "-f", str(fanout or n), "-w", hosts, command]


def pdsh_env(ssh_config: Path) -> dict[str, str]:
    """pdsh's ssh module runs `ssh PDSH_SSH_ARGS`: the sandbox's config, as the ssh loop uses it."""
    return {"PDSH_RCMD_TYPE": "ssh", "PDSH_SSH_ARGS": f"-F {shlex.quote(str(ssh_config))} -2 -a -x -l%u %h"}


def pdsh(ssh_config: Path, n: int, command: str, *, timeout: float = 300, fanout: int | None = None,
         sample: bool = False) -> Timed:
    return run_timed(pdsh_argv(n, command, fanout), env=pdsh_env(ssh_config), timeout=timeout, sample=sample)


def have_pdsh() -> bool:

    return shutil.which(PDSH) is not None
