"""`job.torchrun`: which torchrun options a job may pass through, and why the launcher's own are refused (pure).

The launcher writes torchrun's command line itself (`launcher.plan.launchplan.torchrun_argv`): the node count and rank,
the rendezvous, the processes a node and where the workers' output goes are its own, and a second value would either
be ignored or break what the launcher reads (the workers' files, the ranks). Everything else torchrun takes
(`--numa-binding`, `--local-ranks-filter`, `--max-restarts`, `--signals-to-handle`, ...) passes through as written.
"""

from __future__ import annotations

_SET_BY = "the launcher sets it"
_OUTPUT = (
    "the launcher's agent reads every worker's output from the files torchrun writes with its own --redirects "
    "and --log-dir"
)

OWNED: dict[str, str] = {
    "--nnodes": f"{_SET_BY} from the hosts listed (rendezvous.nodes for a c10d rendezvous)",
    "--node-rank": f"{_SET_BY}: each host's rank is its place in the inventory",
    "--master-addr": "rendezvous.master_addr sets it (default: the first host)",
    "--master-port": "rendezvous.master_port sets it",
    "--rdzv-backend": "rendezvous.backend sets it",
    "--rdzv-endpoint": f"{_SET_BY} from rendezvous.master_addr and master_port",
    "--rdzv-id": f"{_SET_BY}: the run id is the rendezvous id",
    "--rdzv-conf": "rendezvous.conf sets it",
    "--standalone": "a run on one machine is an inventory with one host",
    "--local-addr": f"{_SET_BY} for a c10d rendezvous: each host's addr",
    "--nproc-per-node": "nproc_per_node sets it (a host's, or defaults')",
    "--log-dir": _OUTPUT,
    "--redirects": _OUTPUT,
    "--tee": _OUTPUT,
    "--logs-specs": _OUTPUT,
    "--module": "write `job.module: pkg.train` instead of job.script",
    "--no-python": "write `job.command: ./train.sh` instead of job.script",
    "--run-path": "write the script as job.script",
}
"""torchrun's options (dashes; torchrun takes underscores too) that the launcher sets, and what to write instead."""
SHORT = {"-m": "--module", "-r": "--redirects", "-t": "--tee"}
"""torchrun's one-letter options among them."""
RESTARTS = "--max-restarts"
"""Passed through, unless the inventory's rendezvous.max_restarts sets it already."""


def owned(word: str) -> str | None:
    """The launcher's option that `word` is (or abbreviates, as torchrun's argparse accepts `--nnode`), or None."""
    if word.startswith("--"):
        name = word.split("=", 1)[0].replace("_", "-")
        if name in OWNED:
            return name
        return next((option for option in OWNED if option.startswith(name) and len(name) > len("--")), None)
    if word.startswith("-") and len(word) >= len("-m"):
        return SHORT.get(word[:2])
    return None


def refusal(args: tuple[str, ...], max_restarts: int = 0) -> tuple[int, str] | None:
    """The first word of `job.torchrun` that may not be passed, and why in one sentence; None when all may.

    `max_restarts`: the inventory's rendezvous.max_restarts (torchrun would get --max-restarts twice).
    """
    for i, word in enumerate(args):
        if i == 0 and not word.startswith("-"):
            return i, f"{word!r} is not an option: job.torchrun lists torchrun's options (`--numa-binding, socket`)"
        if word == "--":
            return i, "'--' would end torchrun's options before the job's own words"
        option = owned(word)
        if option is not None:
            what = word.split("=", 1)[0]
            named = what if what.replace("_", "-") == option or what in SHORT else f"{what} (torchrun's {option})"
            return i, f"{named} is the launcher's to set: {OWNED[option]}"
        if max_restarts and word.startswith("--max") and RESTARTS.startswith(word.split("=", 1)[0].replace("_", "-")):
            return i, "rendezvous.max_restarts sets --max-restarts already: keep one of them"
    return None
