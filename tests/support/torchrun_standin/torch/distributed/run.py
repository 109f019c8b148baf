"""The tests' stand-in for `python -m torch.distributed.run` (stdlib only): torchrun as the launcher sees it, without
its `import torch` (1.5-2 CPU-seconds on every node of every run, most of what a test of the launcher's own mechanics
costs on a 2-core machine).

What it keeps of torchrun 2.13 (tests/integration/test_torchrun_standin.py runs both and compares them):
- the static rendezvous: node 0 listens on --master-port (the launcher's store wait and a taken port see it), the
  other nodes connect and every node starts its workers once all have joined; after its workers succeed, a node
  waits for the others to end theirs (torchrun's exit barrier);
- a store for the workers' process group: torchrun serves its own TCPStore to them (TORCHELASTIC_USE_AGENT_STORE=True),
  which needs torch; here rank 0's worker serves it, as `init_process_group` does without torchrun
  (TORCHELASTIC_USE_AGENT_STORE=False), on a port node 0 takes and tells the others with its "go": MASTER_PORT is
  that port, not --master-port. A job that imports torch and joins a group runs under it as under torchrun;
- the workers: `python -u SCRIPT ARGS` (`-m MODULE`, or the command with --no-python), each in a session of its own,
  with torchrun's environment (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, TORCHELASTIC_*, ...) and --redirects 3's
  files: LOG_DIR/<run id>_<random>/attempt_0/<local rank>/stdout.log and stderr.log;
- the ends: every worker ended with 0 -> 0; the first worker to fail -> the others get SIGTERM (SIGKILL 30 s later),
  the ChildFailedError report with its "Root Cause (first observed failure)" block, exit code 1; SIGTERM, SIGINT,
  SIGHUP or SIGQUIT -> "Received N death signal, shutting down workers", the workers get SIGTERM, a SignalException
  traceback, exit code 1. Its log lines have torchrun's glog form.

What it refuses (exit code 2, said): any option it does not keep (a c10d rendezvous, --max-restarts above 0, ...).
What it does not do: read the error file `@record` writes (its report says `error_file: <N/A>`). Tests of those, and
of anything else torchrun itself does, run the real torchrun.
"""

import argparse
import contextlib
import os
import random
import signal
import socket
import string
import subprocess
import sys
import time

HANDLED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
MONITOR_S = 0.1
CLOSE_WAIT_S = 30.0
JOIN_LIMIT_S = 900.0
EXIT_BARRIER_S = 300.0
OWN_FOLDER = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class SignalException(Exception):
    def __init__(self, sigval):
        super().__init__(f"Process {os.getpid()} got signal: {sigval}")
        self.sigval = sigval


def _on_signal(signum, frame):
    raise SignalException(signum)


def log(level, where, message):
    """A line in torchrun's glog form: `W1129 03:05:50.556000 26094 torch/...py:753] message`."""
    now = time.time()
    stamp = time.strftime("%m%d %H:%M:%S", time.localtime(now)) + f".{int((now % 1) * 1e6):06d}"
    sys.stderr.write(f"{level}{stamp} {os.getpid()} {where}] {message}\n")
    sys.stderr.flush()


def parse(argv):
    parser = argparse.ArgumentParser(prog="torchrun (the tests' stand-in)", allow_abbrev=False)
    parser.add_argument("--nnodes", type=int, default=1)
    parser.add_argument("--node-rank", "--node_rank", type=int, default=0)
    parser.add_argument("--nproc-per-node", "--nproc_per_node", type=int, default=1)
    parser.add_argument("--master-addr", "--master_addr", default="127.0.0.1")
    parser.add_argument("--master-port", "--master_port", type=int, default=29500)
    parser.add_argument("--max-restarts", "--max_restarts", type=int, default=0, choices=[0])
    parser.add_argument("--redirects", "-r", default="0", choices=["0", "3"])
    parser.add_argument("--log-dir", "--log_dir", default=None)
    parser.add_argument("--module", "-m", action="store_true")
    parser.add_argument("--no-python", "--no_python", action="store_true")
    parser.add_argument("script")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    return parser.parse_args(argv)


def _free_port():
    with socket.socket() as probe:
        probe.bind(("", 0))
        return probe.getsockname()[1]


class Rendezvous:
    """The static rendezvous over one TCP connection a node: node 0 holds the port (torchrun's store) until it ends,
    and names the port of the workers' store (rank 0's)."""

    def __init__(self, args):
        self.args = args
        self.server = None
        self.peers = []
        self.store_port = None

    def join(self):
        args = self.args
        if args.nnodes == 1:
            self.store_port = _free_port()
            return
        if args.node_rank == 0:
            # A test's stand-in for real torchrun's first seconds after `go` (its agent and rendezvous modules'
            # imports), in which master_port is still free.
            time.sleep(float(os.environ.get("STANDIN_BIND_DELAY_S", "0")))
            self.server = socket.create_server(("", args.master_port))
            while len(self.peers) < args.nnodes - 1:
                peer, _ = self.server.accept()
                if peer.makefile("r").readline().startswith("join "):
                    self.peers.append(peer)
                else:  # a look at whether the port listens (the launcher's store wait): not a node
                    peer.close()
            self.store_port = _free_port()  # once every node joined: the shortest while for another to take it
            for peer in self.peers:
                peer.sendall(b"go %d\n" % self.store_port)
            return
        deadline = time.monotonic() + JOIN_LIMIT_S
        while True:
            try:
                peer = socket.create_connection((args.master_addr, args.master_port), timeout=5)
                break
            except ConnectionRefusedError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        peer.settimeout(None)
        peer.sendall(b"join %d\n" % args.node_rank)
        answer = peer.makefile("r").readline().split()
        if answer[:1] != ["go"]:
            raise ConnectionError(f"the rendezvous on {args.master_addr}:{args.master_port} ended")
        self.store_port = int(answer[1])
        self.peers.append(peer)

    def exit_barrier(self):
        """After this node's workers succeeded: until every node's have (a node gone counts as ended, as torchrun's
        barrier logs an error and goes on)."""
        if self.args.nnodes == 1:
            return
        try:
            if self.args.node_rank == 0:
                for peer in self.peers:
                    peer.settimeout(EXIT_BARRIER_S)
                    peer.makefile("r").readline()
                for peer in self.peers:
                    peer.sendall(b"exit\n")
            else:
                peer = self.peers[0]
                peer.sendall(b"done\n")
                peer.settimeout(EXIT_BARRIER_S)
                peer.makefile("r").readline()
        except OSError as error:
            log("E", "torch/distributed/elastic/agent/server/api.py:1008", f"Error waiting on exit barrier: {error}")


def worker_env(args, local_rank, run_id, error_file, store_port):
    env = dict(os.environ)
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and os.path.abspath(p) != OWN_FOLDER]
    if paths:
        env["PYTHONPATH"] = os.pathsep.join(paths)
    else:
        env.pop("PYTHONPATH", None)
    world = args.nnodes * args.nproc_per_node
    rank = args.node_rank * args.nproc_per_node + local_rank
    env.update({
        "LOCAL_RANK": str(local_rank), "RANK": str(rank), "GROUP_RANK": str(args.node_rank),
        "ROLE_RANK": str(rank), "ROLE_NAME": "default", "LOCAL_WORLD_SIZE": str(args.nproc_per_node),
        "WORLD_SIZE": str(world), "GROUP_WORLD_SIZE": str(args.nnodes), "ROLE_WORLD_SIZE": str(world),
        "MASTER_ADDR": args.master_addr, "MASTER_PORT": str(store_port),
        "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": str(args.max_restarts),
        "TORCHELASTIC_RUN_ID": run_id, "TORCHELASTIC_USE_AGENT_STORE": "False",
        "TORCHELASTIC_ERROR_FILE": error_file, "TORCHELASTIC_SIGNALS_TO_HANDLE": "SIGTERM,SIGINT,SIGHUP,SIGQUIT",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
    })
    if args.nproc_per_node > 1:
        env.setdefault("OMP_NUM_THREADS", "1")
    return env


class Workers:
    def __init__(self, args):
        self.args = args
        self.procs = {}
        self.files = []
        self.ended = {}  # local rank -> (exit code, when)

    def start(self, store_port):
        args, run_id = self.args, "none"
        attempt = None
        if args.log_dir:
            suffix = "".join(random.choice(string.ascii_lowercase + string.digits) for _ in range(8))
            attempt = os.path.join(args.log_dir, f"{run_id}_{suffix}", "attempt_0")
        if args.no_python:
            argv = [args.script, *args.args]
        else:
            argv = [sys.executable, "-u", *(["-m"] if args.module else []), args.script, *args.args]
        for local_rank in range(args.nproc_per_node):
            folder = os.path.join(attempt, str(local_rank)) if attempt else None
            outputs = {}
            if folder and args.redirects == "3":
                os.makedirs(folder, exist_ok=True)
                # open until the workers are closed, as torchrun keeps them
                outputs = {"stdout": open(os.path.join(folder, "stdout.log"), "w"),  # noqa: SIM115
                           "stderr": open(os.path.join(folder, "stderr.log"), "w")}  # noqa: SIM115
                self.files.extend(outputs.values())
            error_file = os.path.join(folder, "error.json") if folder else ""
            env = worker_env(args, local_rank, run_id, error_file, store_port)
            self.procs[local_rank] = subprocess.Popen(argv, env=env, start_new_session=True, **outputs)

    def first_failure(self):
        for local_rank, proc in self.procs.items():
            code = proc.poll()
            if code is not None and local_rank not in self.ended:
                self.ended[local_rank] = (code, time.time())
        failed = [(when, rank) for rank, (code, when) in self.ended.items() if code != 0]
        return min(failed)[1] if failed else None

    def all_succeeded(self):
        return len(self.ended) == len(self.procs) and all(code == 0 for code, _ in self.ended.values())

    def close(self, death_sig=signal.SIGTERM):
        """torchrun's _close: `death_sig` to each live worker's session, SIGKILL to those left after 30 s."""
        live = [proc for proc in self.procs.values() if proc.poll() is None]
        for proc in live:
            log("W", "torch/distributed/elastic/multiprocessing/api.py:1028",
                f"Sending process {proc.pid} closing signal {death_sig.name}")
            _killpg(proc.pid, death_sig)
        end = time.monotonic() + CLOSE_WAIT_S
        for proc in live:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(max(0.0, end - time.monotonic()))
        for proc in live:
            if proc.poll() is None:
                log("W", "torch/distributed/elastic/multiprocessing/api.py:1044",
                    f"Unable to shutdown process {proc.pid} via {death_sig}, forcefully exiting via Signals.SIGKILL")
                _killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        for handle in self.files:
            handle.close()


def _killpg(pid, sig):
    with contextlib.suppress(OSError):
        os.killpg(pid, sig)


def failure_report(args, workers, root_rank):
    """torchrun's ChildFailedError text: the other failures first, then the root cause."""
    def entry(index, local_rank):
        proc = workers.procs[local_rank]
        code = proc.returncode
        stamp = time.strftime("%Y-%m-%d_%H:%M:%S", time.localtime(workers.ended.get(local_rank, (0, time.time()))[1]))
        rank = args.node_rank * args.nproc_per_node + local_rank
        lines = [f"[{index}]:", f"  time      : {stamp}", f"  host      : {socket.getfqdn(socket.gethostname())}",
                 f"  rank      : {rank} (local_rank: {local_rank})"]
        if code < 0:
            name = signal.Signals(-code).name
            lines += [f"  exitcode  : {code} (pid: {proc.pid})  ({name})", "  error_file: <N/A>",
                      f"  traceback : Signal {-code} ({name}) received by PID {proc.pid}"]
        else:
            lines += [f"  exitcode  : {code} (pid: {proc.pid}) ", "  error_file: <N/A>",
                      "  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html"]
        return lines

    others = [rank for rank, proc in workers.procs.items()
              if rank != root_rank and proc.returncode not in (None, 0)]
    rule, thin = "=" * 60, "-" * 60
    text = [rule, f"{args.script} FAILED", thin, "Failures:"]
    if others:
        for index, rank in enumerate(others, 1):
            text += entry(index, rank)
    else:
        text.append("  <NO_OTHER_FAILURES>")
    text += [thin, "Root Cause (first observed failure):", *entry(0, root_rank), rule]
    return "\n".join(text)


def _traceback(last_line):
    sys.stderr.write(f"Traceback (most recent call last):\n  File \"{os.path.abspath(__file__)}\", line 1, in "
                     f"<module>\n    main()\n{last_line}\n")
    sys.stderr.flush()


def main(argv=None):
    args = parse(sys.argv[1:] if argv is None else argv)
    if args.nproc_per_node > 1 and "OMP_NUM_THREADS" not in os.environ:
        sys.stderr.write("*" * 41 + "\nSetting OMP_NUM_THREADS environment variable for each process to be 1 in "
                         "default, to avoid your system being overloaded, please further tune the variable for "
                         "optimal performance in your application as needed. \n" + "*" * 41 + "\n")
    rendezvous, workers = Rendezvous(args), Workers(args)
    try:
        rendezvous.join()
        for sig in HANDLED:  # as torchrun: from its workers' start (a signal during the rendezvous ends it at once)
            signal.signal(sig, _on_signal)
        workers.start(rendezvous.store_port)
        while True:
            time.sleep(MONITOR_S)
            failed = workers.first_failure()
            if failed is not None:
                proc = workers.procs[failed]
                workers.close()
                log("E", "torch/distributed/elastic/multiprocessing/api.py:1002",
                    f"failed (exitcode: {proc.returncode}) local_rank: {failed} (pid: {proc.pid}) of binary: "
                    f"{sys.executable}")
                workers.first_failure()
                _traceback("torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"
                           + failure_report(args, workers, failed))
                return 1
            if workers.all_succeeded():
                workers.close()
                rendezvous.exit_barrier()
                return 0
    except SignalException as error:
        log("W", "torch/distributed/elastic/agent/server/api.py:753",
            f"Received {error.sigval} death signal, shutting down workers")
        workers.close(signal.Signals(error.sigval))  # torchrun closes its workers with the signal it got
        _traceback(f"torch.distributed.elastic.multiprocessing.api.SignalException: {error}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
