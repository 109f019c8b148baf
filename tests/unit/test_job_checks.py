"""The doctor and launch's start gate check the job that will run, whatever form it came in (the inventory's job, or
--script/--module/--command, api.launch's script=/module=/command=): its script is there, its module importable by
the node's python (found, never imported), its command on the node's PATH."""

from __future__ import annotations

import threading
from pathlib import Path

import yaml

from launcher import doctor
from launcher.app.job import JobArgs, job_of
from launcher.config.inventory import parse_inventory
from launcher.config.model import Cluster
from launcher.doctor import Evidence
from launcher.doctor.request import probe_request, session_section
from launcher.node.probe.runnable import module_info
from launcher.plan.launchplan import plan_launch
from tests.support.canned_probes import ADDRS, findings, probe
from tests.support.proberun import run_probe


def make_cluster(job: dict[str, str], env: dict[str, str] | None = None) -> Cluster:
    defaults = {"python": "/opt/venv/bin/python", "workdir": "~/project", **({"env": env} if env else {})}
    data = {"defaults": defaults, "hosts": list(ADDRS), "rendezvous": {"master_port": 29500}, "job": job}
    return parse_inventory(yaml.safe_dump(data), "hosts/test.yaml")


def evidence(cluster: Cluster, **answers: dict) -> Evidence:
    found = {h.name: probe(h.name) for h in cluster.hosts}
    for name, extra in answers.items():
        found[name.replace("_", "-")].update(extra)
    return Evidence(cluster, found, {"free": True, "accepted": 3}, clock=(1000.0, 1001.0), probe_timeout=10.0,
                    probe_times={h.name: 0.4 for h in cluster.hosts})


def test_the_start_gate_asks_the_nodes_of_the_job_the_command_line_names() -> None:
    """`--script nope.py` once checked the inventory's train.py and passed: torchrun then started on a missing file."""
    cluster = make_cluster({"script": "train.py"}, env={"PYTHONPATH": "src", "PATH": "/opt/tools/bin"})
    for job_args, asked in ((JobArgs(script="nope.py"), {"script": "nope.py"}),
                         (JobArgs(module="pkg.train"), {"module": "pkg.train"}),
                         (JobArgs(command="./run.sh"), {"command": "./run.sh"})):
        plan = plan_launch(cluster, job_of(cluster, job_args), run_id="r")
        host = plan.cluster.hosts[1]
        request = session_section(plan.cluster, host, "r", 10.0)["probe"]
        form = next(iter(asked))
        assert {k: request.get(k) for k in ("script", "module", "command") if k in request} == asked, job_args
        assert request["job_env"] == {"PYTHONPATH": "src", "PATH": "/opt/tools/bin"}
        assert probe_request(plan.cluster, host, "all", None)[form] == asked[form]
    plain = make_cluster({"script": "t.py"})
    assert "job_env" not in probe_request(plain, plain.hosts[0], "all", None)


def test_a_module_job_gets_a_finding_on_every_node_not_a_dot() -> None:
    """The `script` column showed `·` for job.module while the summary said `script` passed."""
    cluster = make_cluster({"module": "pkg.train"})
    here = {"module": {"name": "pkg.train", "origin": "/home/u/project/pkg/train.py"}}
    gone = {"module": {"name": "pkg.train", "error": "No module named 'pkg'"}}
    ev = evidence(cluster, node_0=here, node_1=here, node_2=gone)
    ok, = findings(ev, "script", "node-0")
    assert (ok.status, ok.detail) == ("ok", "module pkg.train: /home/u/project/pkg/train.py")
    failed, = findings(ev, "script", "node-2")
    assert failed.status == "fail"
    assert failed.detail == ("module pkg.train cannot be imported by /opt/venv/bin/python on node-2: "
                             "No module named 'pkg'")
    assert "pip install" in failed.fix and "/home/u/project" in failed.fix
    late = evidence(cluster, node_1={"module": {"name": "pkg.train", "late": True, "error": "no answer within 5 s"}})
    assert findings(late, "script", "node-1")[0].status == "warn"
    assert [f.host for f in doctor.evaluate(ev, "fast") if f.status == "fail"] == ["node-2"]


def test_a_command_job_is_looked_for_on_each_node() -> None:
    cluster = make_cluster({"command": "trainer"})
    ev = evidence(cluster, node_0={"command": {"name": "trainer", "path": "/usr/local/bin/trainer"}},
                  node_1={"command": {"name": "trainer", "error": "not found on PATH (/usr/bin:/bin)"}})
    assert findings(ev, "script", "node-0")[0].detail == "command trainer: /usr/local/bin/trainer"
    missing, = findings(ev, "script", "node-1")
    assert missing.status == "fail" and missing.detail == ("command trainer cannot be started on node-1: not found "
                                                           "on PATH (/usr/bin:/bin)")


def _project(root: Path) -> Path:
    """A workdir with a package whose __init__ would leave a mark (and fail) if anything imported it."""
    pkg = root / "pkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(f"open({str(root / 'imported')!r}, 'w').close()\nraise SystemExit('imported')\n")
    (pkg / "train.py").write_text("print('training')\n")
    (root / "run.sh").write_text("#!/bin/sh\n")
    return root


def test_the_probe_finds_a_module_as_python_m_would_without_importing_it(tmp_path: Path) -> None:
    work = _project(tmp_path / "work")
    request = {"mode": "probe", "checks": "fast", "names": [], "workdir": str(work), "gpu_timeout_s": 10.0}
    found = run_probe({**request, "module": "pkg.train"})["module"]
    assert found == {"name": "pkg.train", "origin": str(work / "pkg" / "train.py")}
    assert not (work / "imported").exists()  # the package's __init__ never ran
    assert run_probe({**request, "module": "pkg.nope"})["module"]["error"] == "No module named 'pkg.nope'"
    assert "is a package and cannot be directly executed" in run_probe({**request, "module": "pkg"})["module"]["error"]
    assert run_probe({**request, "module": "json.tool"})["module"]["origin"].endswith("tool.py")  # the stdlib too
    lib = tmp_path / "lib"
    (lib / "other").mkdir(parents=True)
    (lib / "other" / "__init__.py").write_text("")
    asked = {**request, "module": "other", "job_env": {"PYTHONPATH": "../lib"}}  # the inventory's, from the workdir
    assert "cannot be directly executed" in run_probe(asked)["module"]["error"]
    assert run_probe({**request, "module": "other"})["module"]["error"] == "No module named 'other'"


def test_the_probe_looks_for_a_command_where_torchrun_starts_it(tmp_path: Path) -> None:
    work = _project(tmp_path / "work")
    request = {"mode": "probe", "checks": "fast", "names": [], "workdir": str(work), "gpu_timeout_s": 10.0}
    assert run_probe({**request, "command": "sh"})["command"]["path"].endswith("/sh")
    assert run_probe({**request, "command": "./run.sh"})["command"]["error"] == f"{work / 'run.sh'}: not executable"
    (work / "run.sh").chmod(0o755)
    assert run_probe({**request, "command": "./run.sh"})["command"]["path"] == str(work / "run.sh")
    nowhere = run_probe({**request, "command": "sh", "job_env": {"PATH": str(tmp_path)}})["command"]
    assert nowhere["error"] == f"not found on PATH ({tmp_path})"


def test_a_search_that_hangs_is_cut_at_its_bound(tmp_path: Path, monkeypatch) -> None:
    """A filesystem that hangs on the path (a dead NFS server) costs the probe its bound, not the probe timeout."""
    import launcher.node.probe.runnable as runnable

    hung = threading.Event()
    monkeypatch.setattr(runnable, "find_module", lambda name, path: hung.wait(30))
    try:
        answer = module_info(str(tmp_path), "pkg.train", budget=0.2)
    finally:
        hung.set()
    assert answer["late"] and answer["error"] == "no answer within 0.2 s (a hung filesystem on the path?)"
