"""The pure launch plan: torchrun's words per node, rank order and offsets, run dirs, quoting and redaction."""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
import shlex
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.config.inventory import parse_inventory
from launcher.config.model import Cluster, EnvFile, EnvVar, ForwardEnv, Job
from launcher.plan.launchplan import (
    RESERVED_ENV,
    RUNS_ROOT,
    SECRET_MASK,
    LaunchPlan,
    NodeCommand,
    new_run_id,
    plan_launch,
    quote_path,
    rank_offsets,
)
from tests.helpers import inv

HETERO = """\
    defaults: {python: /opt/venv/bin/python, workdir: ~/project}
    hosts:
      - {name: gpu01, nproc_per_node: 4}
      - {name: gpu02, addr: 10.0.0.2, nproc_per_node: 2}
    rendezvous: {master_port: 29611}
    job: {script: train/ddp.py, args: [--epochs, 3]}
"""

NASTY_WORDS = [
    "plain",
    "two words",
    "",
    " ",
    "it's",
    'say "hi"',
    "$(rm -rf ~)",
    "`id`",
    "a; rm -rf /",
    "a && b || c",
    "line one\nline two",
    "tab\there",
    "ünïcødé ✓ 日本",
    "$HOME",
    "${PATH}",
    "*",
    "~",
    "~/x",
    "--nnodes",
    "-m",
    "\\",
    "'\"'\"'",
    "a|b>c<d",
    "#not a comment",
    "!event",
]


UNSET = ["-u", "RANK", "-u", "LOCAL_RANK", "-u", "WORLD_SIZE", "-u", "LOCAL_WORLD_SIZE", "-u", "GROUP_RANK",
         "-u", "ROLE_RANK", "-u", "ROLE_WORLD_SIZE", "-u", "GROUP_WORLD_SIZE", "-u", "NODE_RANK", "-u", "MASTER_ADDR",
         "-u", "MASTER_PORT"]
"""The `env -u NAME` words every shell line starts its env with (TORCHELASTIC_* is removed by the agent)."""
ORDER_TEXT = 'CUDA_DEVICE_ORDER="${CUDA_DEVICE_ORDER:-PCI_BUS_ID}"'
"""... then the GPU order: PCI_BUS_ID (nvidia-smi's numbering) unless the node sets one."""
HEAD = [*UNSET, "CUDA_DEVICE_ORDER=${CUDA_DEVICE_ORDER:-PCI_BUS_ID}"]
"""Those words as a shell reads them."""


def cluster(text: str) -> Cluster:
    return parse_inventory(textwrap.dedent(text), "test.yaml")


def flag(argv: tuple[str, ...], name: str) -> str:
    """The value after flag `name` among torchrun's own options (before the script)."""
    i = argv.index(name)
    return argv[i + 1]


def after_cd(node: NodeCommand) -> list[str]:
    """The words of `shell_line()` after `cd <workdir> && env -u RANK ... NAME=value...` (a node without setup,
    forwarded variables, env file or socket interface)."""
    assert not (node.setup or node.forward_env or node.env_file or node.socket_ifname), node
    words = shlex.split(node.shell_line())
    assert words[0] == "cd" and words[2] == "&&", words
    words = words[3:]
    assert words[:1 + len(HEAD)] == ["env", *HEAD], words
    words = words[1 + len(HEAD) + len(node.env):]
    assert words[:len(node.launcher_env)] == [f"{k}={v}" for k, v in node.launcher_env], words
    return words[len(node.launcher_env):]


def as_shell_reads(node: NodeCommand) -> list[str]:
    """argv as the node's shell reads it from shell_line(): `~/` in home words becomes $HOME (unexpanded by shlex)."""
    return [("$HOME/" + w[2:] if i in node.home_words and w.startswith("~/") else w) for i, w in enumerate(node.argv)]


# --- argv ----------------------------------------------------------------------------------------------------


def test_heterogeneous_nodes() -> None:
    plan = plan_launch(cluster(HETERO), run_id="r1")
    first, second = plan.nodes
    assert [n.host.name for n in plan.nodes] == ["gpu01", "gpu02"]
    for node, rank, nproc in ((first, 0, "4"), (second, 1, "2")):
        assert node.argv[:3] == ("/opt/venv/bin/python", "-m", "torch.distributed.run")
        assert flag(node.argv, "--nnodes") == "2"
        assert flag(node.argv, "--node-rank") == str(rank)
        assert flag(node.argv, "--nproc-per-node") == nproc
        assert flag(node.argv, "--master-addr") == "gpu01"
        assert flag(node.argv, "--master-port") == "29611"
        assert node.node_rank == rank
    assert (first.rank_offset, second.rank_offset) == (0, 4)
    assert plan.cluster.world_size == 6


def test_the_whole_argv_of_a_node() -> None:
    node = plan_launch(cluster(HETERO), run_id="r1").nodes[1]
    assert node.argv == (
        "/opt/venv/bin/python", "-m", "torch.distributed.run",
        "--nnodes", "2", "--node-rank", "1", "--nproc-per-node", "2",
        "--master-addr", "gpu01", "--master-port", "29611",
        "--redirects", "3", "--log-dir", f"{RUNS_ROOT}/r1/gpu02/ranks",
        "train/ddp.py", "--epochs", "3",
    )


def test_master_addr_is_the_first_hosts_addr_on_every_node() -> None:
    plan = plan_launch(cluster("""\
        hosts: [{name: gpu01, addr: 10.0.0.1}, {name: gpu02, addr: 10.0.0.2}, gpu03]
        job: {script: t.py}
    """))
    assert {flag(n.argv, "--master-addr") for n in plan.nodes} == {"10.0.0.1"}
    assert {flag(n.argv, "--master-port") for n in plan.nodes} == {"29500"}


@pytest.mark.parametrize(("nprocs", "offsets"), [
    ([4, 2], [0, 4]),
    ([8, 8, 4, 1], [0, 8, 16, 20]),
    ([4, "auto", 2], [0, 4, None]),
    (["auto", 2], [0, None]),
    ([1, 2, "auto"], [0, 1, 3]),
])
def test_rank_offsets(nprocs: list[int | str], offsets: list[int | None]) -> None:
    hosts = ", ".join(f"{{name: n{i}, nproc_per_node: {p}}}" for i, p in enumerate(nprocs))
    c = cluster(f"hosts: [{hosts}]\njob: {{script: t.py}}\n")
    assert rank_offsets(c) == {f"n{i}": o for i, o in enumerate(offsets)}
    plan = plan_launch(c, run_id="r")
    assert [n.rank_offset for n in plan.nodes] == offsets
    assert [flag(n.argv, "--nproc-per-node") for n in plan.nodes] == [str(p) for p in nprocs]


def test_ranks_follow_inventory_order() -> None:
    plan = plan_launch(cluster("hosts: [zeta, alpha, mid, '10.0.0.1']\njob: {script: t.py}\n"), run_id="r")
    assert [(n.host.name, n.node_rank) for n in plan.nodes] == [("zeta", 0), ("alpha", 1), ("mid", 2),
                                                                ("10.0.0.1", 3)]
    assert [flag(n.argv, "--node-rank") for n in plan.nodes] == ["0", "1", "2", "3"]
    assert {flag(n.argv, "--nnodes") for n in plan.nodes} == {"4"}


@pytest.mark.parametrize("args", [(), ("--epochs", "3"), tuple(NASTY_WORDS)])
def test_script_and_args_come_last_exactly_as_given(args: tuple[str, ...]) -> None:
    job = Job(script="dir with space/train $(x).py", args=args)
    for node in plan_launch(cluster(HETERO), job, run_id="r").nodes:
        assert node.argv[-len(args) - 1:] == (job.script, *args)
        assert node.argv.index(job.script) == len(node.argv) - len(args) - 1


def test_the_inventory_job_is_the_default_and_another_job_replaces_it() -> None:
    c = cluster(HETERO)
    assert plan_launch(c, run_id="r").job == Job("train/ddp.py", ("--epochs", "3"))
    other = Job("eval.py", ("--x",))
    plan = plan_launch(c, other, run_id="r")
    assert plan.job == other
    assert all(n.argv[-2:] == ("eval.py", "--x") for n in plan.nodes)


def test_no_job_at_all_is_an_error() -> None:
    with pytest.raises(ValueError, match="no job"):
        plan_launch(cluster("hosts: [a]\n"))


def test_run_dir_per_node_and_log_dir_inside_it() -> None:
    plan = plan_launch(cluster(HETERO), run_id="20261122-031500-a1b2c3")
    assert RUNS_ROOT == "~/.cache/ddp-launcher/runs"
    for node in plan.nodes:
        assert node.run_dir == f"~/.cache/ddp-launcher/runs/20261122-031500-a1b2c3/{node.host.name}"
        assert flag(node.argv, "--log-dir") == f"{node.run_dir}/ranks"
    assert plan.run_id == "20261122-031500-a1b2c3"


def test_a_plan_gets_a_fresh_run_id() -> None:
    c = cluster(HETERO)
    one, two = plan_launch(c), plan_launch(c)
    assert re.fullmatch(r"\d{8}-\d{6}-[0-9a-f]{6}", one.run_id)
    assert one.run_id != two.run_id
    assert one.nodes[0].run_dir.endswith(f"/{one.run_id}/gpu01")


def test_env_and_workdir_come_from_the_host() -> None:
    plan = plan_launch(cluster("""\
        defaults: {env: {A: "1"}, workdir: /srv/a}
        hosts: [a, {name: b, env: {A: "2", B: x}, workdir: ~/b}]
        job: {script: t.py}
    """), run_id="r")
    a, b = plan.nodes
    assert (a.workdir, [(v.name, v.value) for v in a.env]) == ("/srv/a", [("A", "1")])
    assert (b.workdir, [(v.name, v.value) for v in b.env]) == ("~/b", [("A", "2"), ("B", "x")])


def test_a_script_that_reads_as_an_option_is_refused() -> None:
    with pytest.raises(ValueError, match="starts with '-'"):
        plan_launch(cluster(HETERO), Job("--nnodes"), run_id="r")


def test_planning_is_a_value() -> None:
    c = cluster(HETERO)
    assert plan_launch(c, run_id="r") == plan_launch(c, run_id="r")
    assert isinstance(plan_launch(c, run_id="r"), LaunchPlan)


# --- shell_line ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("word", NASTY_WORDS)
def test_shell_line_round_trips_every_word(word: str) -> None:
    c = cluster("hosts: [{name: a, workdir: '~/dir with space'}]\n")
    host = dataclasses.replace(c.hosts[0], env=(EnvVar("PLAIN", value=word), EnvVar("OTHER", value=word)))
    c = dataclasses.replace(c, hosts=(host,))
    job = Job(script="t.py" if not word or word.startswith("-") else word, args=(word, f"--opt={word}", word))
    node = plan_launch(c, job, run_id="r").nodes[0]
    assert after_cd(node) == as_shell_reads(node)
    words = shlex.split(node.shell_line())
    assert words[:5 + len(HEAD)] == ["cd", "$HOME/dir with space", "&&", "env", *HEAD, f"PLAIN={word}"]
    assert words[5 + len(HEAD)] == f"OTHER={word}"


def test_shell_line_without_env_has_only_the_unsets() -> None:
    node = plan_launch(cluster(HETERO), run_id="r").nodes[0]
    assert node.shell_line().startswith(
        'cd "$HOME"/project && env -u RANK -u LOCAL_RANK -u WORLD_SIZE -u LOCAL_WORLD_SIZE -u GROUP_RANK -u ROLE_RANK '
        "-u ROLE_WORLD_SIZE -u GROUP_WORLD_SIZE -u NODE_RANK -u MASTER_ADDR -u MASTER_PORT "
        f"{ORDER_TEXT} /opt/venv/bin/python -m torch.distributed.run ")
    assert after_cd(node) == as_shell_reads(node)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.text(alphabet=st.characters(exclude_characters="\0", exclude_categories=["Cs"])), max_size=5))
def test_shell_line_round_trips_any_args(args: list[str]) -> None:
    node = plan_launch(cluster("hosts: [a]\n"), Job("t.py", tuple(args)), run_id="r").nodes[0]
    assert after_cd(node) == as_shell_reads(node)


@pytest.mark.skipif(shutil.which("sh") is None, reason="needs a POSIX sh")
def test_a_real_shell_reads_the_same_words(tmp_path: Path) -> None:
    """What `sh` makes of the line (not only shlex): the words, the directory, the environment torchrun would get
    (stale ranks gone), nothing executed by accident."""
    (tmp_path / "my project").mkdir()
    c = cluster("hosts: [{name: a, workdir: '~/my project', env: {GREETING: 'hi $(touch pwned) `touch pwned`'}}]\n")
    args = tuple(w for w in NASTY_WORDS if w)
    node = plan_launch(c, Job("t.py", args), run_id="r").nodes[0]
    line = node.shell_line()
    # Put a printer before the program, keeping the shell's parsing of everything else.
    printer = """sh -c 'printf "%s\\0" "${RANK-unset}" "${MASTER_ADDR-unset}" "$GREETING" "$@"' printer """
    line = line.replace("&& env ", "&& pwd && env ", 1).replace(" python3 -m ", f" {printer}python3 -m ", 1)
    out = subprocess.run(["sh", "-c", line], capture_output=True, cwd=tmp_path, check=True, timeout=10,
                         env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin", "RANK": "7", "MASTER_ADDR": "stale"},
                         ).stdout.decode()
    where, _, printed = out.partition("\n")
    assert where == str(tmp_path / "my project")
    home = [str(tmp_path) + w[1:] if i in node.home_words and w.startswith("~/") else w  # `~/`: the home
            for i, w in enumerate(node.argv)]
    assert printed.split("\0")[:-1] == ["unset", "unset", node.env[0].value, *home]
    assert not list(tmp_path.rglob("pwned"))


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
    text = plan.dry_run_text()
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
    text = plan_launch(cluster(HETERO), run_id="r1").dry_run_text()
    assert text.startswith("run r1: 2 node(s), world size 6, rendezvous at gpu01:29611\n")
    assert "node 0: gpu01\n" in text
    assert "node 1: gpu02 (reached by peers as 10.0.0.2)\n" in text
    assert f"run dir {RUNS_ROOT}/r1/gpu02" in text
    assert "why each flag is there:" in text


def test_dry_run_text_with_auto_says_auto() -> None:
    text = plan_launch(cluster("hosts: [{name: a, nproc_per_node: auto}]\njob: {script: t.py}\n")).dry_run_text()
    assert "world size auto" in text


# --- quote_path ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("path", "quoted"), [
    ("~", '"$HOME"'),
    ("~/x", '"$HOME"/x'),
    ("~/my project", "\"$HOME\"/'my project'"),
    ("~/$(id)", "\"$HOME\"/'$(id)'"),
    ("/opt/venv/bin/python", "/opt/venv/bin/python"),
    ("/a b/c", "'/a b/c'"),
    ("relative/dir", "relative/dir"),
    ("~user/x", "'~user/x'"),
    ("~x", "'~x'"),
    ("$HOME/x", "'$HOME/x'"),
    ("it's", "'it'\"'\"'s'"),
    ("/a;rm -rf /", "'/a;rm -rf /'"),
])
def test_quote_path(path: str, quoted: str) -> None:
    assert quote_path(path) == quoted


@pytest.mark.skipif(shutil.which("sh") is None, reason="needs a POSIX sh")
@pytest.mark.parametrize(("path", "expected"), [
    ("~", "{home}"),
    ("~/x", "{home}/x"),
    ("~/my project/$(touch pwned)", "{home}/my project/$(touch pwned)"),
    ("~user/x", "~user/x"),
    ("$HOME/x", "$HOME/x"),
    ("/a b/`touch pwned`", "/a b/`touch pwned`"),
])
def test_quote_path_means_the_same_to_a_real_shell(tmp_path: Path, path: str, expected: str) -> None:
    home = tmp_path / "home dir"
    home.mkdir()
    out = subprocess.run(["sh", "-c", f"printf '%s' {quote_path(path)}"], capture_output=True, check=True,
                         env={"HOME": str(home), "PATH": "/usr/bin:/bin"}, cwd=tmp_path, timeout=10).stdout.decode()
    assert out == expected.format(home=home)
    assert not list(tmp_path.rglob("pwned"))


# --- run ids -------------------------------------------------------------------------------------------------


def test_run_ids_sort_by_time() -> None:
    start = dt.datetime(2026, 11, 22, 3, 15, 0)
    times = [start + dt.timedelta(seconds=s) for s in (0, 1, 59, 60, 3600, 86400, 86400 * 40, 86400 * 400)]
    ids = [new_run_id(t) for t in times]
    assert sorted(ids) == ids
    assert sorted(reversed(ids)) == ids
    assert new_run_id(dt.datetime(2026, 1, 2, 3, 4, 5)).startswith("20260102-030405-")
    assert new_run_id(dt.datetime(2025, 12, 31, 23, 59, 59)) < new_run_id(dt.datetime(2026, 1, 1, 0, 0, 0))


def test_run_ids_differ_even_in_the_same_second() -> None:
    now = dt.datetime(2026, 11, 22, 3, 15, 0)
    ids = {new_run_id(now) for _ in range(10)}
    assert len(ids) == 10
    assert all(re.fullmatch(r"20261122-031500-[0-9a-f]{6}", i) for i in ids)
    assert new_run_id() != new_run_id()


# --- nodes that share nothing: unset, setup, forwarded variables, env file, socket interface ------------------


SHARE_NOTHING = """\
    defaults:
      workdir: ~/project
      setup: [source /opt/conda/bin/activate train, module load cuda/12.4]
      forward_env: [WANDB_*, {pattern: HF_TOKEN, secret: true}, WANDB_PROJECT]
      env_file: .env
      socket_ifname: auto
      env: {NCCL_DEBUG: WARN}
    hosts:
      - {name: gpu01, addr: 10.0.0.1}
      - name: gpu02
        setup: []
        forward_env: ~
        env_file: {path: /etc/train.env, secret: true}
        socket_ifname: ib0
      - name: gpu03
        env_file: ~
        socket_ifname: ~
        forward_env: [{pattern: AWS_*, secret: true}]
    job: {script: t.py}
"""


def test_reserved_env_is_importable_from_the_plan() -> None:
    assert RESERVED_ENV[0] == "RANK" and RESERVED_ENV[-1] == "TORCHELASTIC_*" and len(RESERVED_ENV) == 12


def test_node_commands_carry_the_hosts_new_fields() -> None:
    one, two, three = plan_launch(cluster(SHARE_NOTHING), run_id="r").nodes
    assert all(n.unset_env == RESERVED_ENV for n in (one, two, three))
    assert one.setup == ("source /opt/conda/bin/activate train", "module load cuda/12.4") == three.setup
    assert two.setup == ()
    assert one.forward_env == (ForwardEnv("WANDB_*"), ForwardEnv("HF_TOKEN", secret=True), ForwardEnv("WANDB_PROJECT"))
    assert two.forward_env == one.forward_env
    assert three.forward_env == (*one.forward_env, ForwardEnv("AWS_*", secret=True))
    assert (one.env_file, two.env_file, three.env_file) == (EnvFile(".env"), EnvFile("/etc/train.env", True), None)
    assert (one.socket_ifname, two.socket_ifname, three.socket_ifname) == ("auto", "ib0", None)
    assert all(n.env == (EnvVar("NCCL_DEBUG", value="WARN"),) for n in (one, two, three))


def test_shell_line_with_every_feature() -> None:
    one, two, three = plan_launch(cluster(SHARE_NOTHING), run_id="r").nodes
    unset = " ".join(UNSET) + " " + ORDER_TEXT
    torchrun = "python3 -m torch.distributed.run --nnodes 3"
    assert one.shell_line().startswith(
        "source /opt/conda/bin/activate train && module load cuda/12.4 && "
        f"cd \"$HOME\"/project && env {unset} '<from .env>' '<forwarded: WANDB_*>' HF_TOKEN='<secret>' "
        "WANDB_PROJECT=\"$WANDB_PROJECT\" NCCL_SOCKET_IFNAME='=<iface to 10.0.0.1>' "
        f"GLOO_SOCKET_IFNAME='<iface to 10.0.0.1>' NCCL_DEBUG=WARN {torchrun} --node-rank 0 ")
    assert two.shell_line().startswith(
        f"cd \"$HOME\"/project && env {unset} '<from /etc/train.env, secret>' '<forwarded: WANDB_*>' "
        "HF_TOKEN='<secret>' WANDB_PROJECT=\"$WANDB_PROJECT\" NCCL_SOCKET_IFNAME==ib0 GLOO_SOCKET_IFNAME=ib0 "
        f"NCCL_DEBUG=WARN {torchrun} --node-rank 1 ")
    assert three.shell_line().startswith(
        "source /opt/conda/bin/activate train && module load cuda/12.4 && "
        f"cd \"$HOME\"/project && env {unset} '<forwarded: WANDB_*>' HF_TOKEN='<secret>' "
        f"WANDB_PROJECT=\"$WANDB_PROJECT\" '<forwarded, secret: AWS_*>' NCCL_DEBUG=WARN {torchrun} --node-rank 2 ")


def test_placeholders_are_single_words_and_the_rest_round_trips() -> None:
    job = Job("t.py", tuple(w for w in NASTY_WORDS if w))
    for node, variables in zip(plan_launch(cluster(SHARE_NOTHING), job, run_id="r").nodes, (7, 7, 5), strict=True):
        line = node.shell_line()
        setup = "".join(f"{step} && " for step in node.setup)
        assert line.startswith(setup)
        words = shlex.split(line[len(setup):])
        assert words[:4 + len(HEAD)] == ["cd", "$HOME/project", "&&", "env", *HEAD]
        assert len(words) == 4 + len(HEAD) + variables + len(node.argv)  # each placeholder is one word
        assert words[-len(node.argv):] == as_shell_reads(node)


@pytest.mark.skipif(shutil.which("sh") is None, reason="needs a POSIX sh")
def test_a_real_shell_runs_setup_in_the_same_shell_and_sets_the_interface(tmp_path: Path) -> None:
    c = cluster("""\
        hosts:
          - name: a
            workdir: '~/my project'
            setup: ["export FROM_SETUP='set up; ok'", "cd /", "export SECOND=\\"$FROM_SETUP\\""]
            socket_ifname: eth1
            forward_env: [COPIED]
            env: {REF: {from_env: COPIED}}
    """)
    (tmp_path / "my project").mkdir()
    node = plan_launch(c, Job("t.py", ("a b",)), run_id="r").nodes[0]
    printer = ("""sh -c 'printf "%s\\0" "$PWD" "$FROM_SETUP" "$SECOND" "$NCCL_SOCKET_IFNAME" "$GLOO_SOCKET_IFNAME" """
               """"$COPIED" "$REF" "${RANK-unset}" "$@"' printer """)
    line = node.shell_line().replace(" python3 -m ", f" {printer}python3 -m ", 1)
    out = subprocess.run(["sh", "-c", line], capture_output=True, cwd=tmp_path, check=True, timeout=10,
                         env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin", "RANK": "3", "COPIED": "it's  $x"},
                         ).stdout.decode()
    home = [str(tmp_path) + w[1:] if i in node.home_words and w.startswith("~/") else w
            for i, w in enumerate(node.argv)]
    assert out.split("\0")[:-1] == [str(tmp_path / "my project"), "set up; ok", "set up; ok", "=eth1", "eth1",
                                    "it's  $x", "it's  $x", "unset", *home]


@pytest.mark.skipif(shutil.which("sh") is None, reason="needs a POSIX sh")
def test_a_line_with_placeholders_is_still_valid_shell() -> None:
    for node in plan_launch(cluster(SHARE_NOTHING), run_id="r").nodes:
        result = subprocess.run(["sh", "-n", "-c", node.shell_line()], capture_output=True, timeout=10)
        assert result.returncode == 0, (node.shell_line(), result.stderr)


def test_dry_run_text_says_what_each_new_setting_does() -> None:
    text = plan_launch(cluster(SHARE_NOTHING), run_id="r").dry_run_text()
    assert ("\nunset from the node's login environment: RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, "
            "ROLE_RANK, ROLE_WORLD_SIZE, GROUP_WORLD_SIZE, NODE_RANK, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_* "
            "(torchrun sets them)\n") in text
    node0 = text[text.index("node 0: gpu01"):text.index("node 1: gpu02")]
    node1 = text[text.index("node 1: gpu02"):text.index("node 2: gpu03")]
    node2 = text[text.index("node 2: gpu03"):text.index("\nunset from")]
    assert "  setup: 2 line(s) run first, in the shell that then starts torchrun\n" in node0
    assert "  forward_env: WANDB_*, HF_TOKEN (secret), WANDB_PROJECT: copied from your environment at launch\n" in node0
    assert "  env_file: .env is read on this machine at launch\n" in node0
    assert ("  socket_ifname auto: NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME name the interface this node routes to "
            "10.0.0.1 through, found on the node at launch\n") in node0
    assert "setup:" not in node1
    assert "  env_file: /etc/train.env is read on this machine at launch; its values are secret, never shown\n" in node1
    assert ("  socket_ifname: NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME are ib0 (the interface NCCL and gloo use)\n"
            in node1)
    assert "env_file" not in node2 and "socket_ifname" not in node2
    assert "  forward_env: WANDB_*, HF_TOKEN (secret), WANDB_PROJECT, AWS_* (secret): copied" in node2


def test_dry_run_text_without_new_settings_has_only_the_unset_line() -> None:
    text = plan_launch(cluster(HETERO), run_id="r").dry_run_text()
    for word in ("setup:", "forward_env", "env_file", "socket_ifname", "sync:"):
        assert word not in text
    assert "unset from the node's login environment: RANK, " in text


def test_dry_run_text_says_what_sync_copies() -> None:
    text = plan_launch(cluster("hosts: [a]\njob: {script: t.py}\nsync: {}\n"), run_id="r").dry_run_text()
    assert "\nsync: . (on this machine) to each node's workdir\n" in text
    text = plan_launch(cluster("hosts: [a]\njob: {script: t.py}\nsync: {src: src, dest: /scratch/p, "
                               "exclude: [data/, '*.pt']}\n"), run_id="r").dry_run_text()
    assert "\nsync: src (on this machine) to /scratch/p, except data/, *.pt\n" in text


def test_secrets_of_new_settings_never_show() -> None:
    plan = plan_launch(cluster("""\
        hosts:
          - name: a
            forward_env: [{pattern: API_KEY, secret: true}]
            env_file: {path: secret.env, secret: true}
        job: {script: t.py}
    """), run_id="r")
    line = plan.nodes[0].shell_line()
    assert "$API_KEY" not in line and "API_KEY='<secret>'" in line and "'<from secret.env, secret>'" in line
    assert line in plan.dry_run_text()


def test_the_dry_run_shows_the_request_a_node_gets_with_secrets_by_name(tmp_path) -> None:
    """`--dry-run --json` ends with the first node's request as JSON (the settings resolved once, in plan/request.py): a
    secret's value never appears, a value copied at launch is said as such, the hang watch as resolved."""
    import io
    import json as json_

    from launcher import app
    from launcher.options import Options
    from launcher.run.wiring import Wiring

    inventory = tmp_path / "cluster.yaml"
    inventory.write_text("hosts: [gpu01, gpu02]\njob: {script: train.py, hang_timeout: 90}\ndefaults:\n  env:\n"
                         "    TOKEN: {value: s3cr3t-value, secret: true}\n    MODE: fast\n"
                         "    KEY: {from_env: HOME_KEY}\n")
    out = io.StringIO()
    wiring = Wiring(out=out, err=io.StringIO())
    assert app.launch(str(inventory), dry_run=True, opts=Options(grace=7), wiring=wiring) == 0
    assert "the request gpu01's agent gets" not in out.getvalue()  # the agent's JSON only with --json
    out = io.StringIO()
    wiring = Wiring(out=out, err=io.StringIO())
    assert app.launch(str(inventory), dry_run=True, opts=Options(grace=7), wiring=wiring, as_json=True) == 0
    text = out.getvalue()
    assert "s3cr3t-value" not in text
    request = json_.loads(text[text.index("\n{", text.index("the request gpu01's agent gets")):])
    assert request["env"] == {"TOKEN": "<secret TOKEN>", "MODE": "fast", "KEY": "<$HOME_KEY at launch>"}
    assert request["secret_names"] == ["TOKEN"]
    assert (request["grace"], request["node_rank"], request["watch"]) == (7, 0, True)


def test_the_plan_resolves_the_hang_timeout_and_retries_once() -> None:
    """The command line's (or settings') value wins, else the inventory's; everything after reads the plan."""
    from launcher.config.inventory import parse_inventory
    from launcher.plan.launchplan import plan_launch

    cluster = parse_inventory("hosts: [a, b]\nretries: 2\njob: {script: train.py, hang_timeout: 90}\n", "i.yaml")
    plan = plan_launch(cluster)
    assert (plan.hang_timeout, plan.retries) == (90.0, 2)
    given = plan_launch(cluster, hang_timeout=0, retries=0)
    assert (given.hang_timeout, given.retries) == (0, 0)
    bare = plan_launch(parse_inventory("hosts: [a]\njob: {script: train.py}\n", "i.yaml"))
    assert (bare.hang_timeout, bare.retries) == (None, 0)  # None: learnt from the run


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
