"""`inv doctor --net` on 3 real sandbox nodes: every node's figures from a real torchrun job (gloo), and a node whose
link is made slow flagged at the straggler share. The sandbox's nodes are one machine's processes: each times its
compute, but theirs are not compared (they share two cores); telling a slow CPU from a slow network is the verdict's
unit test (tests/unit/test_doctor_net.py).

The slow node is slow by construction, not by a share of a busy machine's time: its rank waits SLOW_LINK_S before
each all_reduce of its pairs. A node once stopped 30 ms of every 100 (then 70, as cpulimit does) measured 0.84x the
median on CI's loaded cores, and a plain run on a busy machine flagged a healthy node (0.48x: the pairs are measured
one after the other, each in whatever load the machine had then), so no run here relies on the load being even.
With node-2 far below, the others cannot be flagged: each one's figure is at least that of the pair node-0 and
node-1 make, and the median of three is one of those two."""

from __future__ import annotations

import json
import textwrap
import time
from pathlib import Path

from devtools.observe import free_port
from tests.helpers import inv
from tests.support.nodeenv import node_python

SLOW_LINK_S = 0.5
"""What node-2's link adds to each of its pair collectives: 16 MiB over one machine's loopback take tens of ms, loaded
or not, so its pairs measure a tenth of the others' at most (the straggler share is 0.8)."""


def _slow_link(folder: Path) -> str:
    """A python for node-2 whose ranks (RANK set: the measurement's workers, not torchrun nor the agent) wait
    SLOW_LINK_S before every all_reduce in a group of their pair. Its sitecustomize comes after the launcher's hook
    on PYTHONPATH, which runs it after its own."""
    site = folder / "slow-link"
    site.mkdir()
    (site / "sitecustomize.py").write_text(textwrap.dedent(f"""\
        import os

        if "RANK" in os.environ:
            import time

            import torch.distributed as dist

            _all_reduce = dist.all_reduce

            def all_reduce(tensor, *args, group=None, **kwargs):
                if group is not None:  # a pair's group; the whole group's is the default one
                    time.sleep({SLOW_LINK_S})
                return _all_reduce(tensor, *args, group=group, **kwargs)

            dist.all_reduce = all_reduce
        """))
    wrapper = folder / "python-slow-link"
    wrapper.write_text(f'#!/bin/bash\nexport PYTHONPATH="${{PYTHONPATH:+$PYTHONPATH:}}{site}"\n'
                       f'exec {node_python()} "$@"\n')
    wrapper.chmod(0o755)
    return str(wrapper)


def test_doctor_net_measures_every_node_and_flags_the_slow_one(make_sandbox, tmp_path: Path) -> None:
    box = make_sandbox(3, torchrun="stand-in", master_port=free_port(), python_override={2: _slow_link(tmp_path)})
    began = time.monotonic()
    result = inv("doctor", "--hosts", str(box.inventory), "--net", "--json", log_dir=tmp_path / "logs")
    took = time.monotonic() - began
    assert result.returncode == 0, result.stdout + result.stderr  # slow is a warning: the run would work, slowly
    report = json.loads(result.stdout)
    # the time said is the doctor's whole, the measurement too (it said `in 0.9 s` after 11.8 s): all but inv's start
    timings = report["timings"]
    assert timings["net_s"] > 1 and timings["total_s"] >= timings["net_s"] + timings["probe_s"], timings
    assert timings["total_s"] > took - 5, (timings, took)
    assert "net" in report["checks"] and report["net"]["backend"] == "gloo" and report["net"]["world"] == 3
    assert report["net"]["busbw_gbps"] > 0 and report["net"]["latency_ms"] > 0
    nets = {node: values["net"] for node, values in report["nodes"].items()}
    assert sorted(nets) == ["node-0", "node-1", "node-2"]
    for node, net in nets.items():
        assert net["busbw_gbps"] > 0 and net["latency_ms"] > 0, (node, net)
        assert net["compute_ms"] > 0 and not net["slow_compute"], (node, net)  # timed, not compared: one machine
        assert sorted(net["links"]) == sorted({"node-0", "node-1", "node-2"} - {node})
    assert [node for node, net in nets.items() if net["slow"]] == ["node-2"], nets
    [finding] = [f for f in report["findings"] if f["check"] == "net" and f["status"] != "ok"]
    assert finding["host"] == "node-2" and finding["status"] == "warn"
    assert "the median node" in finding["detail"] and "every all_reduce of the run waits for it" in finding["detail"]
    assert "socket_ifname" in finding["fix"] and "MTU" in finding["fix"]
