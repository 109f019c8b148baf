"""Jobs as people write them: job.script, job.module (torchrun -m), job.command (torchrun --no-python), exactly one;
job.torchrun passed through, the launcher's own torchrun options refused with one sentence naming file and field."""

from __future__ import annotations

import textwrap

import pytest

from launcher.app.job import JobArgs, job_of
from launcher.config.inventory import parse_inventory
from launcher.config.model import Cluster, Job
from launcher.config.torchrun import OWNED
from launcher.errors import InventoryError, UsageError
from launcher.plan.dryrun import dry_run_text
from launcher.plan.launchplan import plan_launch
from tests.helpers import inv

SRC = "hosts/cluster.yaml"
HOSTS = "hosts: [a, b]\ndefaults: {python: /v/bin/python, nproc_per_node: 2}\n"


def cluster(job: str, rendezvous: str = "") -> Cluster:
    return parse_inventory(HOSTS + rendezvous + textwrap.dedent(job), SRC)


def refusal(job: str, rendezvous: str = "") -> str:
    with pytest.raises(InventoryError) as info:
        cluster(job, rendezvous)
    return str(info.value)


def tail(c: Cluster, job: Job | None = None) -> list[str]:
    """torchrun's words after its --log-dir (what the job adds), on node 0."""
    argv = plan_launch(c, job, run_id="r").nodes[0].argv
    return list(argv[argv.index("--log-dir") + 2:])


def test_a_module_runs_under_torchrun_m_and_a_command_under_no_python() -> None:
    module = cluster("job: {module: pkg.train, args: [--lr, '0.1']}\n")
    assert module.job == Job(module="pkg.train", args=("--lr", "0.1"))
    assert tail(module) == ["-m", "pkg.train", "--lr", "0.1"]
    command = cluster("job: {command: ./train.sh, args: [fast]}\n")
    assert tail(command) == ["--no-python", "./train.sh", "fast"]
    assert tail(cluster("job: {script: train.py}\n")) == ["train.py"]


def test_the_dry_run_says_why_the_form_and_each_passed_option_are_there() -> None:
    c = cluster("job: {module: pkg.train, torchrun: [--numa-binding, socket, --local-ranks-filter, '0', "
                "--virtual-local-rank]}\n")
    assert tail(c) == ["--numa-binding", "socket", "--local-ranks-filter", "0", "--virtual-local-rank", "-m",
                       "pkg.train"]
    text = dry_run_text(plan_launch(c, run_id="r"))
    assert "  -m pkg.train                job.module: each worker runs `python -m pkg.train`" in text
    for option in ("--numa-binding socket", "--local-ranks-filter 0", "--virtual-local-rank"):
        assert f"  {option:<28}from job.torchrun: passed to torchrun as written" in text


@pytest.mark.parametrize(("job", "message"), [
    ("job: {script: t.py, module: pkg.t}\n",
     "hosts/cluster.yaml:3: job.module: and job.script are both set: a job runs one script, module or command"),
    ("job: {args: [x]}\n", "hosts/cluster.yaml:3: job: has no `script:`"),
    ("job: {module: -x}\n", "hosts/cluster.yaml:3: job.module: '-x' starts with '-': torchrun would read it as an "
                            "option"),
    ("job: {command: ./t.sh, torchrun: --nnodes}\n", "job.torchrun: must be a list of words, got '--nnodes' (str)"),
])
def test_a_job_names_exactly_one_form(job: str, message: str) -> None:
    assert message in refusal(job)


@pytest.mark.parametrize(("word", "said"), [
    ("--nnodes", "--nnodes is the launcher's to set: the launcher sets it from the hosts listed"),
    ("--node_rank", "--node_rank is the launcher's to set: the launcher sets it: each host's rank"),
    ("--master-addr=x", "--master-addr is the launcher's to set: rendezvous.master_addr sets it"),
    ("--master_port", "--master_port is the launcher's to set: rendezvous.master_port sets it"),
    ("--rdzv-backend", "rendezvous.backend sets it"),
    ("--rdzv_endpoint", "from rendezvous.master_addr and master_port"),
    ("--rdzv-id", "the run id is the rendezvous id"),
    ("--nproc-per-node", "nproc_per_node sets it"),
    ("--log-dir", "reads every worker's output from the files torchrun writes"),
    ("--redirects", "--redirects is the launcher's to set"),
    ("-r", "-r is the launcher's to set"),
    ("-r3", "-r3 (torchrun's --redirects) is the launcher's to set"),
    ("--tee", "--tee is the launcher's to set"),
    ("-t", "-t is the launcher's to set"),
    ("-m", "write `job.module: pkg.train` instead"),
    ("--no_python", "write `job.command: ./train.sh`"),
    ("--standalone", "an inventory with one host"),
    ("--nnode", "--nnode (torchrun's --nnodes) is the launcher's to set"),  # argparse takes an abbreviation
    ("--master", "--master (torchrun's --master-addr) is the launcher's to set"),
    ("--rdzv", "(torchrun's --rdzv-backend)"),
])
def test_an_option_the_launcher_sets_is_refused_in_one_sentence(word: str, said: str) -> None:
    message = refusal(f"job: {{script: t.py, torchrun: [--numa-binding, socket, '{word}', '1']}}\n")
    assert message.startswith("hosts/cluster.yaml:3: job.torchrun[2]: "), message
    assert said in message and "\n" not in message


def test_every_owned_option_is_refused() -> None:
    for option in OWNED:
        assert "is the launcher's to set" in refusal(f"job: {{script: t.py, torchrun: ['{option}']}}\n")


def test_torchruns_own_restarts_pass_unless_the_rendezvous_sets_them() -> None:
    c = cluster("job: {script: t.py, torchrun: [--max-restarts, '3']}\n")
    assert tail(c)[:2] == ["--max-restarts", "3"]
    elastic = "rendezvous: {backend: c10d, max_restarts: 2}\n"
    message = refusal("job: {script: t.py, torchrun: [--max_restarts, '3']}\n", elastic)
    assert "job.torchrun[0]: rendezvous.max_restarts sets --max-restarts already: keep one of them" in message


def test_passed_options_start_with_an_option_and_never_end_torchruns_options() -> None:
    assert "'socket' is not an option" in refusal("job: {script: t.py, torchrun: [socket]}\n")
    assert "'--' would end torchrun's options" in refusal("job: {script: t.py, torchrun: [--role, x, '--']}\n")


def test_the_command_line_replaces_the_form_and_takes_one() -> None:
    c = cluster("job: {script: t.py, args: [--epochs, '3'], torchrun: [--numa-binding, socket]}\n")
    job = job_of(c, JobArgs(module="pkg.eval"))
    assert (job.script, job.module, job.args, job.torchrun) == (None, "pkg.eval", ("--epochs", "3"),
                                                                 ("--numa-binding", "socket"))
    assert job_of(c, JobArgs(command="./x.sh", args="a 'b c'")).argv == ("--no-python", "./x.sh", "a", "b c")
    with pytest.raises(UsageError, match=r"^--script and --module both name what to run: give one of them$"):
        job_of(c, JobArgs(script="x.py", module="m"))
    assert job_of(parse_inventory(HOSTS, SRC), JobArgs(module="m")).form == ("module", "m")


def test_module_and_command_on_the_command_line(tmp_path) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text(HOSTS + "job: {script: t.py}\n")
    shown = inv("launch", "--hosts", str(path), "--module", "pkg.train", "--args", "--lr 0.1", "--dry-run")
    assert shown.returncode == 0, shown.stderr
    assert "-m pkg.train --lr 0.1" in shown.stdout and "t.py" not in shown.stdout
    both = inv("launch", "--hosts", str(path), "--module", "m", "--command", "c", "--dry-run")
    assert both.returncode == 2 and "error: --module and --command both name what to run" in both.stderr
