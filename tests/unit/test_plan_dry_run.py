"""The launch plan's dry run and its secrets: what `--dry-run` says (nodes, world, settings and where each came from,
a node's request) and what it never shows."""

from __future__ import annotations

import shlex

from launcher.plan.dryrun import dry_run_text
from launcher.plan.launchplan import RUNS_ROOT, SECRET_MASK, plan_launch
from tests.helpers import inv
from tests.support.plans import HEAD, HETERO, cluster

# --- secrets -------------------------------------------------------------------------------------------------


SECRETS = """\
    defaults:
      env:
        PASSWORD: {value: hunter2-literal, secret: true}
    hosts:
      - name: a
        env:
          TOKEN: {from_env: MY_TOKEN, secret: true}
          COPIED: {from_env: WANDB_KEY}
          OPEN: visible-value
      - b
    job: {script: t.py}
"""


def test_secret_values_never_appear_in_shell_line_or_dry_run_text() -> None:
    plan = plan_launch(cluster(SECRETS), run_id="r")
    text = dry_run_text(plan)
    lines = [n.shell_line() for n in plan.nodes]
    for shown in (text, *lines):
        assert "hunter2" not in shown
        assert "MY_TOKEN" not in shown  # even the name of a secret's source stays out
    a, b = lines
    assert shlex.split(a)[3:8 + len(HEAD)] == ["env", *HEAD, f"PASSWORD={SECRET_MASK}", f"TOKEN={SECRET_MASK}",
                                               "COPIED=$WANDB_KEY", "OPEN=visible-value"]
    assert shlex.split(b)[3:5 + len(HEAD)] == ["env", *HEAD, f"PASSWORD={SECRET_MASK}"]
    assert "TOKEN" not in b
    assert a in text and b in text


def test_secrets_stay_in_the_plan_for_the_transport() -> None:
    node = plan_launch(cluster(SECRETS), run_id="r").nodes[0]
    by_name = {v.name: v for v in node.env}
    assert by_name["PASSWORD"].value == "hunter2-literal" and by_name["PASSWORD"].secret
    assert by_name["TOKEN"].from_env == "MY_TOKEN" and by_name["TOKEN"].secret


# --- dry_run_text ------------------------------------------------------------------------------------------------


def test_dry_run_text_names_every_node_the_world_and_the_rendezvous() -> None:
    text = dry_run_text(plan_launch(cluster(HETERO), run_id="r1"))
    assert text.startswith("run r1: 2 node(s), world size 6, rendezvous at gpu01:29611\n")
    assert "node 0: gpu01\n" in text
    assert "node 1: gpu02 (reached by peers as 10.0.0.2)\n" in text
    assert f"run dir {RUNS_ROOT}/r1/gpu02" in text
    assert "why each flag is there:" in text


def test_dry_run_text_with_auto_says_auto() -> None:
    text = dry_run_text(plan_launch(cluster("hosts: [{name: a, nproc_per_node: auto}]\njob: {script: t.py}\n")))
    assert "world size auto" in text


def test_the_dry_run_shows_the_request_a_node_gets_with_secrets_by_name(tmp_path) -> None:
    """`--dry-run --json` ends with the first node's request as JSON (the settings resolved once, in plan/request.py): a
    secret's value never appears, a value copied at launch is said as such, the hang watch as resolved."""
    import io
    import json as json_

    from launcher import app
    from launcher.run.run_io import RunIO
    from launcher.settings import Settings

    inventory = tmp_path / "cluster.yaml"
    inventory.write_text("hosts: [gpu01, gpu02]\njob: {script: train.py, hang_timeout: 90}\ndefaults:\n  env:\n"
                         "    TOKEN: {value: s3cr3t-value, secret: true}\n    MODE: fast\n"
                         "    KEY: {from_env: HOME_KEY}\n")
    out = io.StringIO()
    run_io = RunIO(out=out, err=io.StringIO())
    assert app.launch(str(inventory), dry_run=True, settings=Settings.of(grace=7), run_io=run_io) == 0
    assert "the request gpu01's agent gets" not in out.getvalue()  # the agent's JSON only with --json
    out = io.StringIO()
    run_io = RunIO(out=out, err=io.StringIO())
    assert app.launch(str(inventory), dry_run=True, settings=Settings.of(grace=7), run_io=run_io, as_json=True) == 0
    text = out.getvalue()
    assert "s3cr3t-value" not in text
    request = json_.loads(text[text.index("\n{", text.index("the request gpu01's agent gets")):])
    assert request["env"] == {"TOKEN": "<secret TOKEN>", "MODE": "fast", "KEY": "<$HOME_KEY at launch>"}
    assert request["secret_names"] == ["TOKEN"]
    assert (request["grace"], request["node_rank"], request["watch"]) == (7, 0, True)


def test_the_dry_run_shows_the_settings_the_run_uses_and_where_each_came_from(tmp_path) -> None:
    """`--retries 0 --hang-timeout 900` over an inventory's `retries: 2`: the dry run said `retries: 2: ...` and
    nowhere 900, in ~150 lines that were mostly the agent's JSON; it says what the run uses, from where, and the JSON
    only with --json."""
    inventory = tmp_path / "cluster.yaml"
    inventory.write_text("hosts: [gpu01, gpu02]\nretries: 2\njob: {script: train.py}\n")
    shown = inv("launch", "--hosts", str(inventory), "--dry-run", "--retries", "0", "--hang-timeout", "900",
                timeout=60, env={"INVOKE_LAUNCHER_GRACE": "3"})
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert not any(line.startswith("retries: 2") for line in lines), shown.stdout
    settings = lines[lines.index("settings the run uses that are not their defaults, and where each came from:"):]
    said = {line.split()[0]: line.split(None, 2)[1:] for line in settings[1:]}
    assert said["retries"] == ["0", "--retries (over the inventory's retries: 2)"], settings
    assert said["hang_timeout"] == ["900", "--hang-timeout"] and said["grace"] == ["3", "INVOKE_LAUNCHER_GRACE"]
    assert said["hosts"] == [str(inventory), "--hosts"]
    assert "agent gets" not in shown.stdout and not any(line.startswith((" \"", "{")) for line in lines)
    assert len(lines) < 60, len(lines)
    inventoried = inv("launch", "--hosts", str(inventory), "--dry-run", "--json", timeout=60)
    assert "retries: 2: a run that loses a node" in inventoried.stdout
    assert "  retries  2  " in inventoried.stdout and f"{inventory} (retries)" in inventoried.stdout
    assert "the request gpu01's agent gets" in inventoried.stdout
    assert inv("launch", "--hosts", str(inventory), "--json", timeout=60).returncode == 2
