"""The doctor's output: the table, its JSON, the failure the launch raises, and the probe's command line."""

from __future__ import annotations

import json

from rich.console import Console

from launcher import doctor
from launcher.doctor import Finding
from launcher.errors import DoctorFailed, LauncherError, NodeFailure
from tests.support.canned_probes import ADDRS, canned_report, evidence, make_cluster, probe


def test_render_table_marks_each_check_and_lists_each_fix() -> None:
    blind = probe("node-1")
    blind["resolve"]["node-0"] = {"error": "gai error -2: Name or service not known"}
    low = probe("node-2")
    low["disk_free"] = 1 << 20
    console = Console(record=True, width=200, color_system=None)
    doctor.render_table(canned_report(evidence(node_1=blind, node_2=low)), console)
    text = console.export_text()
    rows = {line.split()[1]: line for line in text.splitlines() if line.startswith("│ node-")}
    assert rows["node-1"].count("✗") == 1 and rows["node-2"].count("!") == 1
    assert rows["node-0"].count("✓") == len(doctor.CHECKS) - 1  # every check but the container hosts' image
    assert '✗ node-1 dns: node-1 cannot resolve node-0' in text
    assert 'fix: add "10.0.0.1 node-0" to /etc/hosts on node-1' in text
    assert "1 failure(s), 1 warning(s)" in text


def test_render_table_prints_names_details_and_fixes_as_plain_text_not_markup() -> None:
    odd = "x[/]y"
    report = doctor.Report(
        source="hosts/[bold]odd[/].yaml", hosts=("node-0", odd), checks=("ssh", "dns"),
        findings=(Finding("node-0", "ssh", "ok", "connected"),
                  Finding(odd, "ssh", "fail", "refused: [/] and [red]x[/red]", "fix [/] it [link=x]"),
                  Finding(odd, "dns", "warn", "[/]")),
        probes={"node-0": None, odd: None}, timings={"total_s": 0.5})
    console = Console(record=True, width=200, color_system=None)
    doctor.render_table(report, console)
    text = console.export_text()
    assert "".join(text.split()).startswith("doctor:2node(s)fromhosts/[bold]odd[/].yaml")  # wrapped to the table
    rows = [line.split()[1::2] for line in text.splitlines() if line.startswith("│ ")]
    assert rows == [["node-0", "·", "✓", "·"], [odd, "·", "✗", "!"]]  # no probe time: neither node answered
    assert "✗ x[/]y ssh: refused: [/] and [red]x[/red]\n    fix: fix [/] it [link=x]\n" in text
    assert "! x[/]y dns: [/]\n" in text
    assert "1 failure(s), 1 warning(s) in 0.5 s" in text


def test_report_json_holds_the_same_findings() -> None:
    report = canned_report(evidence(node_2=NodeFailure("node-2", "refused", "connection refused", "start sshd"),
                              times={"node-0": 0.412, "node-1": 0.5}))
    data = json.loads(doctor.report_json(report))
    assert data["ok"] is False
    assert [Finding(**f) for f in data["findings"]] == list(report.findings)
    assert data["nodes"]["node-0"]["probe"]["hostname"] == "node-0"
    assert data["nodes"]["node-2"]["probe"] is None
    assert [data["nodes"][h]["probe_s"] for h in ADDRS] == [0.412, 0.5, None]  # no connection, no probe


def test_render_table_shows_each_probes_time_and_the_slow_one_with_its_fix() -> None:
    ev = evidence(times={"node-0": 0.41, "node-1": 0.52, "node-2": 6.04}, probe_timeout=20.0)
    console = Console(record=True, width=200, color_system=None)
    doctor.render_table(canned_report(ev), console)
    text = console.export_text()
    header = next(line for line in text.splitlines() if "node" in line and "probe" in line)
    assert header.split()[1:4] == ["node", "┃", "probe"]
    rows = {line.split()[1]: line.split() for line in text.splitlines() if line.startswith("│ node-")}
    assert [rows[h][3:5] for h in ADDRS] == [["0.4", "s"], ["0.5", "s"], ["6.0", "s"]]
    assert rows["node-2"].count("!") == 1
    assert "! node-2 python: node-2's probe took 6.0 s (the others 0.4-0.5 s): " in text
    assert "0 failure(s), 1 warning(s)" in text


def test_doctor_failed_lists_failures_and_fixes() -> None:
    blind = probe("node-1")
    blind["resolve"]["node-0"] = {"error": "gai error -2: Name or service not known"}
    error = DoctorFailed(canned_report(evidence(node_1=blind), "fast"))
    assert isinstance(error, LauncherError) and error.exit_code == 1
    assert doctor.DoctorFailed is DoctorFailed  # it lives in launcher.errors, still importable from the doctor
    text = str(error)
    assert text.startswith("the doctor found 1 problem(s); nothing was started:")
    assert '    fix: add "10.0.0.1 node-0" to /etc/hosts on node-1' in text


def test_probe_command_quotes_the_interpreter() -> None:
    assert doctor.probe_command("~/my env/bin/python").startswith("exec \"$HOME\"/'my env/bin/python' -S -c ")
    assert doctor.probe_command("/opt/venv/bin/python").startswith("exec /opt/venv/bin/python -S -c 'import sys,zlib,")
    request = doctor.probe_request(make_cluster(), make_cluster().hosts[1], "fast", {"token": "t", "window": 1})
    assert request["names"] == ["node-0", "node-1", "node-2"] and request["is_master"] is False
    assert request["script"] == "train.py" and request["workdir"] == "~/project"
