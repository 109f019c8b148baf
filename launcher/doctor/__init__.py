"""The doctor: probe every node once, compare, and say what would make a multi-node run hang or diverge.

`evidence` holds the data; `checklist` runs the pure checks in order (each registered once, by name, in
`registry`: those of a node's own setup in `checks_node` and `checks_python`, those between nodes in `checks_net`);
`request` what each node's probe is sent; `collect` the I/O (connect, probe all nodes in parallel, evaluate;
`DoctorGate` for launch, whose agents probe in their own start session); `report` the table and the JSON. The probe
itself is `launcher/node/probe/probe.py`, stdlib-only, sent over each node's connection.
"""

import importlib
import importlib.util
from typing import Any

from launcher.doctor.checklist import CHECKS, FAST_CHECKS, evaluate, selected_checks
from launcher.doctor.checks_net import requested_names
from launcher.doctor.checks_python import slow_probe_limit
from launcher.doctor.evidence import Evidence, Finding, Outcome, ProbeFailed, Report, Status
from launcher.doctor.registry import Check, check
from launcher.errors import DoctorFailed
from launcher.limits import MAX_CLOCK_SKEW_S, MIN_DISK_BYTES, SLOW_PROBE_FACTOR, SLOW_PROBE_MARGIN_S, SLOW_PROBE_SHARE

_RENDERING = ("MARKS", "render_table", "report_json")
"""From launcher.doctor.report, imported when first used: rich is no cost to a launch that only checks."""
_COLLECTING = ("CheckMode", "DoctorGate", "default_gate", "run_doctor")
"""From launcher.doctor.collect (the I/O: SSH, the agents' sessions), imported when first used: `inv status` reads
FAST_CHECKS for its help, and needs none of it."""
_SENDING = (
    "LISTEN_WINDOW_S",
    "LISTENER_MARGIN_S",
    "PROBE_SOURCE",
    "TOKEN_READ_S",
    "connect_section",
    "listen_request",
    "probe_command",
    "probe_input",
    "probe_request",
    "session_section",
    "session_token",
)
"""From launcher.doctor.request (what each node is sent: the probe's source among it), imported when first used."""


def __getattr__(name: str) -> Any:
    if name in _RENDERING:
        from launcher.doctor import report

        return getattr(report, name)
    if name in _COLLECTING:
        from launcher.doctor import collect

        return getattr(collect, name)
    if name in _SENDING:
        from launcher.doctor import request

        return getattr(request, name)
    if importlib.util.find_spec(f"{__name__}.{name}") is not None:  # a submodule nothing imported yet (a dotted path)
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "CHECKS",
    "FAST_CHECKS",
    "LISTENER_MARGIN_S",
    "LISTEN_WINDOW_S",
    "MARKS",
    "MAX_CLOCK_SKEW_S",
    "MIN_DISK_BYTES",
    "PROBE_SOURCE",
    "SLOW_PROBE_FACTOR",
    "SLOW_PROBE_MARGIN_S",
    "SLOW_PROBE_SHARE",
    "TOKEN_READ_S",
    "Check",
    "CheckMode",
    "DoctorFailed",
    "DoctorGate",
    "Evidence",
    "Finding",
    "Outcome",
    "ProbeFailed",
    "Report",
    "Status",
    "check",
    "connect_section",
    "default_gate",
    "evaluate",
    "listen_request",
    "probe_command",
    "probe_input",
    "probe_request",
    "render_table",
    "report_json",
    "requested_names",
    "run_doctor",
    "selected_checks",
    "session_section",
    "session_token",
    "slow_probe_limit",
]
