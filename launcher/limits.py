"""The launcher's internal limits: the numbers no user sets, each with why it is what it is, grouped by the package
that uses it. The user's options and their defaults are `launcher.options`; SSH's are `launcher.transport.sshsettings`.

A node program has numbers only from here (sent in its request: `NODE_TIMING`, `SYNC_TIMING`, the sections that
`launcher.run.launch` builds) or from the one block of `launcher/node/wire.py` that declares its own.
"""

from __future__ import annotations

# --- an attached run's heartbeats and output (launcher.run) ------------------------------------------------------
HEARTBEAT_DIVISOR = 4
"""Heartbeats go this many times per timeout, so that one late beat never stops a healthy run."""
MAX_LINE_BYTES = 64 * 1024
"""A line longer than this (output without newlines) is cut into pieces of this size, each marked."""
CUT_MARK = b" [line cut: no newline within %d bytes]" % MAX_LINE_BYTES
"""What ends a line cut at MAX_LINE_BYTES (the console's and the nodes' log merger's)."""

LOG_POLL_S = 0.2
"""Seconds a node's agent waits before it looks again at quiet worker log files: the most a line lags there. Each look
costs ~100 us of CPU (a thread's wake-up, a read a file): with a look every 0.05 s an attached agent spent 3.0 ms of
CPU a second of a healthy run (a line every 0.2 s), 1.0 ms with 0.2; 16 nodes that share a machine's cores paid
that beside their 16 trainers."""

LOG_CHUNK = 64 * 1024
"""Bytes a node's agent reads from one worker's log file at a time (a full read means more waits: no pause)."""

SLURM_STOP_WAIT = 120.0
"""Seconds `inv stop --job` waits for SLURM to end every process of a job (its KillWait is 30 s by default)."""

ACTION_MARGIN = 20.0
"""Seconds an agent action (stop, status) may take beyond its grace period before it counts as lost."""


def action_timeout(grace: float) -> float:
    """How long a stop/status action may take on a node: the grace period plus ACTION_MARGIN."""
    return grace + ACTION_MARGIN


AWAY_AFTER_BEATS = 3
"""A node counts its launcher as away (`inv status` says so, with when the run will stop by itself) after this many
heartbeats did not come: one late beat is a busy network, three are a launcher that sleeps or lost its way."""
ATTACH_TAIL_BYTES = 64 * 1024
"""What `attach` shows of a run's log when this machine has no copy of it (another machine started the run): the
lines of its last this many bytes."""


def heartbeat_interval(timeout: float | None) -> float:
    """Seconds between two heartbeats for a given timeout (at most 5 s; 5 s with no bound)."""
    return 5.0 if timeout is None else min(5.0, timeout / HEARTBEAT_DIVISOR)


# --- SSH (launcher.transport) ------------------------------------------------------------------------------
FDS_PER_NODE = 6
"""Open files a node costs the launcher for a whole run: its socket, Paramiko's channel pipe and event, a selector,
and room for a ProxyJump hop (measured ~4 without one)."""

FD_RESERVE = 64
"""Open files the launcher needs besides its nodes (Python, logs, the console, pipes)."""


# --- an attached run's decisions (launcher.run) -----------------------------------------------------------------
STALL = 2.0
"""A gap this long between two of the waiter's steps means the launcher itself was frozen, not its nodes."""
REATTACH_AFTER_BEATS = 2.5
"""A node that sent nothing for this many of its beats is reconnected to at once (a new SSH connection, the run's
console taken there): a roaming network or a NAT that forgot the flow leaves a TCP connection open that carries
nothing, and the silence timeout is the bound for coming back, not a wait before trying."""
REATTACH_FIRST_S = 0.25
"""The first pause between two tries at reconnecting to a node; it doubles after each failed try..."""
REATTACH_MAX_S = 4.0
"""... up to this (every try is bounded by connect_timeout itself), until the silence timeout since the loss."""
EOF_GRACE_S = 2.0
"""A node's session whose output has ended this long without its command's exit is one whose console the run let go
(another launcher took it, or its supervisor is ending): it is asked why over a new session."""
CATCH_UP_WAIT_S = 30.0
"""The most a launcher back from away (or a node reconnected) waits to have read what its nodes printed meanwhile
before it says how many lines it caught up."""
STOP_MARGIN = 5.0
"""Seconds beyond the grace period that a node gets to confirm a stop before the launcher gives up on it."""
SWEEP_MARGIN = 3.0
"""Seconds beyond the grace period the launcher waits for a sweep over a new channel (a node whose sshd answers
needs about one: a session, the agent's start, a look at /proc); one whose sshd does not is reported instead."""


# --- the doctor's judgement (launcher.doctor) ---------------------------------------------------------------------
MIN_DISK_BYTES = 1 << 30
"""Less free space than this where a node's workdir is fails the doctor's disk check."""
MAX_CLOCK_SKEW_S = 5.0
"""A node's clock further than this from the controller's fails the doctor's clock check."""
SLOW_PROBE_MARGIN_S = 2.0
"""A slow probe answered at least this much later than the typical node's (above SSH and interpreter-start noise)."""
SLOW_PROBE_FACTOR = 2.0
"""... and took at least this many times as long (a load every node shares is nobody's fault)."""
SLOW_PROBE_SHARE = 0.5
"""A probe that used more than this share of probe_timeout is slow whatever its peers took: the next may not fit."""

GPU_DRIVER_FLOOR = {"11": "450.80.02", "12": "525.60.13", "13": "580.65.06"}
"""CUDA major version -> the oldest Linux driver that runs anything built with it (CUDA's minor version compatibility;
NVIDIA's "CUDA Compatibility" guide, table "CUDA Toolkit 11.x, 12.x and 13.x driver version ranges"): torch built
for CUDA 12.x fails to find a GPU on an older driver. Below it the doctor's `gpus` check fails."""
GPU_DRIVER_FOR_CUDA = {
    "11.8": "520.61.05",
    "12.1": "530.30.02",
    "12.2": "535.54.03",
    "12.3": "545.23.06",
    "12.4": "550.54.14",
    "12.5": "555.42.02",
    "12.6": "560.28.03",
    "12.8": "570.26",
    "12.9": "575.51.03",
    "13.0": "580.65.06",
}
"""CUDA major.minor (those torch's wheels are built for) -> the Linux driver that CUDA release shipped with and
supports in full (NVIDIA's CUDA Toolkit release notes, table "CUDA Toolkit and Corresponding Driver Versions", the
GA release's "Toolkit Driver Version"). Between the floor and this torch runs by minor version compatibility, without
what needs the newer driver (PTX compiled for a newer GPU, some newer APIs): a warning. Read the other way it names
the newest CUDA a node's driver supports in full (the CUDA build to install there)."""

# --- the doctor's probes (launcher.doctor.request) --------------------------------------------------------------------
NVIDIA_SMI_TIMEOUT_S = 10.0
"""The most one nvidia-smi call may take on a node (the doctor's probe, a launch's checks, `inv top`'s refresh):
without persistence mode the driver sets up every GPU again for each call, about a second a GPU on 8-GPU nodes; a
call past this is a GPU stuck in the driver. It fits in probe_timeout's default with the DNS budget beside it (the
probe starts nvidia-smi first and resolves names meanwhile)."""
SMI_SHARE = 0.5
"""... and at most this share of a shorter probe_timeout: the probe then still answers in time, saying nvidia-smi did
not (a probe cut off at its timeout would read as a python that hangs at start)."""
LISTEN_WINDOW_S = 3.0
"""How long a node keeps retrying a refused connection to the master's listener (which may still be starting)."""
TOKEN_READ_S = 2.0
"""How long a node waits for the listener's token once connected (no answer: something else listens there)."""
LISTENER_MARGIN_S = 5.0
"""The master's listener lives this much longer than the probes may take (it stops earlier when they have answered)."""
PULL_MARGIN_S = 30.0
"""How much longer than pull_timeout the launcher waits for a node's `--pull` answer: the node ends its pull at
pull_timeout itself (TERM, then KILL a few seconds later), then asks the image's id and answers."""
RESOLVE_WORKERS = 16
"""Threads each node's probe resolves names on: every host's name, on every node, is N lookups a node (N x N in the
cluster); 16 at a time keep a 256-node doctor within the probe's DNS budget without N threads per node."""


# --- SLURM (launcher.slurm) -------------------------------------------------------------------------------------------
STEP_END_WAIT = 5.0
"""Seconds the step gets to end by itself once its stdin closed (every agent then stops its part) before SIGTERM."""
SUBMIT_TIMEOUT = 120.0
"""Seconds sbatch may take (it retries an unreadable slurm.conf for 60 s before it gives up)."""
QUERY_TIMEOUT = 30.0
"""Seconds squeue, scontrol, sacct or scancel may take."""
SACCT_TIMEOUT = 10.0
"""Seconds sacct may take: it is only asked about jobs the controller has forgotten, and a record may answer."""
SLURM_POLL = 1.0
"""Seconds between two looks at a job that is followed or being cancelled."""
SLURM_TAIL_CHUNK = 1 << 20
"""Bytes of a job's output read and printed at a time: memory stays this, whatever the file's size."""


# --- the console and the log mirror (launcher.report) -----------------------------------------------------------------
MIRROR_QUEUE_CHUNKS = 1024
"""Chunks (up to 64 KiB each) the log copy may lag behind the run before it gives up with a warning."""
MIRROR_CLOSE_S = 30.0
"""How long the launcher waits at the end for the log copy to reach the disk."""
TAIL_LINES = 40
"""Lines of each node's output kept for the root-cause report."""
TAIL_WIDTH = 1000
"""Characters of each of those lines kept (a progress bar without newlines is one long line)."""


# --- retries (launcher.plan.retry) ------------------------------------------------------------------------------------
FAILURES_TO_BLACKLIST = 2
"""A node that caused this many failed attempts sits out for the cool-down (one failure may be bad luck)."""


# --- code sync (launcher.sync) ----------------------------------------------------------------------------------------
SYNC_REPLY_TIMEOUT = 60.0
"""Seconds a node may take to answer (start Python and stat the tree; rename everything into place)."""
SYNC_SEND_CHUNK = 1 << 20
"""Bytes per send: small files are packed together into chunks of this size."""
SYNC_SHARED_BYTES = 64 << 20
"""Bytes of small files a sync keeps read for all its nodes (the least recently used dropped beyond)."""
SYNC_LOCK_WAIT = 60.0
"""Seconds a node's sync waits for another sync into the same destination (a shared workdir) to end."""
SYNC_RELAY_MIN_NODES = 4
"""`sync.relay: auto` relays when at least this many nodes need the same files: below it, the controller's link
carries a few copies, and a relay's first connection between nodes is one more thing to go wrong."""
SYNC_RELAY_MIN_SAVED = 8 << 20
"""... and when relaying saves the controller's link at least this many bytes (copies not sent, times their size): a
relay costs a round to the nodes and connections between them, ~50 ms; 8 MB take 0.7 s on a 100 Mbit/s uplink."""
SYNC_RELAY_FANOUT = 4
"""Nodes each relaying node passes the stream on to: 256 nodes are four hops from the controller."""


# --- SSH channels (launcher.transport) --------------------------------------------------------------------------------
SEND_LOCK_WAIT = 0.1
"""Seconds a non-blocking send waits for another send on the same channel (a few bytes take microseconds)."""


# --- reading an inventory (launcher.config) ---------------------------------------------------------------------------
MAX_MERGED_PAIRS = 100_000
"""At most this many key/value pairs in all mappings together once merge keys (`<<`) are expanded: a few hundred
hosts of a few dozen keys stay far below it; a merge-key bomb (each level merging the one before twice) does not."""


# --- `ddpl init` (launcher.app.newcluster; its node program: launcher/node/probe/seek.py) -----------------------------
INIT_PYTHON_WAIT_S = 30.0
"""How long one interpreter on a node may take to say whether it finds torch: a cold start from a network file
system takes tens of seconds (see launcher.settings.DEFAULT_PROBE_TIMEOUT); a warm one a few hundredths."""
INIT_SMI_WAIT_S = 10.0
"""How long `nvidia-smi -L` may take to list a node's GPUs (well under a second unless its driver is stuck)."""
INIT_WAIT_S = 300.0
"""The most a node's whole look may take (every interpreter tried, nvidia-smi) before it counts as no answer."""


# --- the Python API (launcher.api) ----------------------------------------------------------------------------------
API_WAIT_POLL_S = 2.0
"""Seconds between two looks at a detached run's state while `Run.wait()` waits for its end (each look is one short
agent session a node, as `status` opens)."""


NODE_CODE_CACHE: dict[str, object] = {"root": "~/.cache/ddp-launcher/code", "keep_s": 30 * 24 * 3600.0}
"""Where each node keeps the node modules compiled (launcher/node/loader.py: ~9 ms of CPU a session saved), and how
long an entry not written again is kept (entries are removed when a new one is stored)."""


# --- the node programs' waits and read sizes (sent in every request; their own local bounds: node/common/bounds.py) ---
NODE_TIMING: dict[str, float] = {
    "poll_s": 0.05,  # a stop's wait steps; an attached agent's KILL again while its run is killed
    "wait_s": 0.1,  # `go`'s wait and a followed log's idle step
    "check_s": 1.0,  # a followed log's look at the run and the launcher; an attached agent's at the heartbeat clock
    "supervisor_poll_s": 0.02,  # a stop's look at whether the run's supervisor has recorded the exit code
    "supervisor_wait_s": 2.0,  # how long a stop waits for that record
    "kill_wait_s": 5.0,  # how long a stop waits for KILLed processes to be gone
    "read_chunk": 1 << 16,  # bytes of the log read at a time
    # torchrun on a node that joins the store waits for its port before trying it (launcher/node/agent/storewait.py): at
    # most this long (then torch's own retry goes on), checking this often (a plain connection; torch's backoff after
    # a refusal is 0.26-0.68 s)
    "store_wait_s": 60.0,
    "store_poll_s": 0.02,
}
"""Every wait and read size of the node agent (launcher/node/wire.py `AGENT_TIMING`): each agent request's
`timing`."""
SYNC_TIMING: dict[str, float] = {
    "wait_s": 0.1,
    "read_chunk": 1 << 20,
    "relay_connect_s": 5.0,
    "relay_wait_s": 10.0,
    "relay_chunk": 1 << 18,
}
"""syncd's: between two tries at another sync's lock; bytes of the stream read at a time; a relay's bound on
connecting to the next node, a relayed node's on waiting for its stream to come, and the bytes passed on at a time
(launcher/node/sync/syncrelay.py)."""


# --- stacks and hangs (launcher.run.takestacks, launcher.watch.hang) ------------------------------------------------
STACKS_WAIT_S = 5.0
"""Seconds each worker has to write its stack once asked (faulthandler answers in milliseconds; a node under load
may not)."""
FLIGHT_RECORDER_ENV = {
    "TORCH_FR_BUFFER_SIZE": "2000",
    "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",
    "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
}
"""NCCL's flight recorder for a run on GPU nodes (the last 2000 collectives per rank, dumped on a timeout into the
run directory), unless the user set any of its variables. Both names of the buffer: torch reads TORCH_FR_* first and
the deprecated TORCH_NCCL_* where it is older; from torch 2.11 on the node leaves the deprecated ones out (it warns of
them on every rank: launcher/node/agent/recorder.py, which sets the file names alike)."""
COLLECTIVES = {"status_s": 1.0, "arrivals_s": 5.0, "keep": 200, "cost_factor": 100.0, "buffer": "500"}
"""Each worker's collectives' thread (launcher/node/worker/collectives.py): the groups' progress read every `status_s`
(a hang is judged from it), the arrival times every `arrivals_s` at least (the straggler rule) and never sooner than
`cost_factor` times the last such read took (under 1% of the worker's time), the last `keep` of them per process
group in the file; on a node without GPUs, torch's recorder keeps `buffer` collectives (TORCH_FR_BUFFER_SIZE, unless
the user set it: torch 2.13 records gloo's collectives by default too, and the bound keeps a full read's cost known),
enough for `arrivals_s` at 100 a second."""
COLLECTIVES_FRESH_S = 10.0
"""A rank's collectives read longer ago than this (its worker's thread could not run: the GIL held in a C call) are
not judged from: the hang's stacks decide alone (launcher/watch/arrival.py)."""
ARRIVALS_KEPT = 1000
"""The most collectives per process group whose arrival times the launcher keeps (the straggler's window)."""
NCCL_MAX_BYTES = 64 << 20
"""The most of a node's flight recorder dumps brought back with its stacks."""
NCCL_DUMP_WAIT_S = 5.0
"""Seconds a node's agent waits for the dumps it asked torch for through the debug-info pipes of a hung run: torch's
monitor thread reads its pipe about once a second, then writes the dump."""
EVENT_CHUNK = 800
"""Characters of data in one `part` event line: a large answer (every worker's stack) travels in parts, as srun
cuts long output lines."""
STACKS_MARGIN_S = 3.0
"""Seconds beyond STACKS_WAIT_S the launcher waits for a node's stacks (the node's answer has to travel too)."""
HANG_FLOOR_S = 300.0
"""The learnt hang timeout is never shorter: a healthy run may be quiet this long (a checkpoint, an evaluation)."""
HANG_FACTOR = 4.0
"""The learnt hang timeout is this many times the longest quiet gap the run has shown between progress lines."""
HANG_LOOKS_APART_S = 3.0
"""Seconds between the two looks at every rank's stack once no progress was seen for the hang timeout: a rank whose
main thread moved between them is not stuck (a spinning thread keeps a hung rank's CPU time growing: never progress)."""
STALL_FACTOR = 4.0
"""Every rank idle (a sleep, a dead mount, a stuck loader; none waits for another) for this many hang timeouts is a
stall, which `--on-hang` acts on (learnt: 20 minutes at least; no evaluation sits idle that long, a dead mount does)."""
SPARE_AFTER_S = 5.0
"""A c10d run's node with no worker this long after the others had theirs is a spare (launcher/watch/spares.py)."""
HANG_EXIT = 124
"""The launcher's exit code when it stopped a run it found hung (`timeout`'s code)."""
INTERRUPTED_EXIT = 130
"""An attached launch's exit code after Ctrl-C (what a shell reports for it: 128 + SIGINT)."""
AWAY_EXIT = 129
"""An attached launch that lost its run without the run failing (128 + SIGHUP): its terminal closed, another launcher
took the run (`attach`), or the nodes stopped their part past a heartbeat bound (`--heartbeat-timeout`)."""
STOPPED_EXIT = 143
"""An attached launch whose run a stop from another terminal ended (128 + SIGTERM): not the run's success or failure."""

# What `inv status` and `inv stop` print (launcher/report/states.py).
STATE_ROWS_MAX = 16
"""Above this many nodes their states are grouped (a row per run, state and exit code, the nodes as a hostlist)."""

# `inv top` (launcher/run/topfeed.py; the node side is launcher/node/agent/sampler.py).
TOP_INTERVAL_S = 1.0
"""Seconds between two views (each node's agent sends a snapshot that often)."""
TOP_ONCE_S = 3.0
"""How long `inv top --once` watches before its snapshot: CPU % and step rates need two looks."""
TOP_ONCE_LEAST_S = 0.5
"""The least `inv top --once` watches: where no rank could show a rate for a longer look (a hung run, the view that is
wanted fast), a node answers after this much, with CPU % over it (clock ticks of 10 ms: to 2 %)."""
TOP_STILL_S = 2 * TOP_ONCE_S
"""A rank whose output files are older than this steps less than once a TOP_ONCE_S look: the rest of the look could
bring it one timed line at most, and a rate from lines needs two. (A rank with a progress record must be still for
TOP_RATE_WINDOW_S: its counts carry their own times, so one more step gives a rate.)"""
TOP_READ_S = 0.1
"""How often a node's agent reads its ranks' new output between snapshots: a step's time is known to this much."""
TOP_TAIL_BYTES = 64 << 10
"""How much of a rank's files written before the view began is read for its last line and step."""
TOP_KEEP_LINES = 20
"""Lines of the followed rank (`l` in the view) each snapshot carries."""
TOP_RATE_WINDOW_S = 30.0
"""A rank's step rate is over its steps of the last this many seconds."""
TOP_GPU_REFRESH_S = 2.0
"""Seconds between two of a node's nvidia-smi calls while `inv top` watches (a background refresh: a snapshot takes
the last answer and says its age). A call costs 100-500 ms of CPU on 8 GPUs: once a second would be a core's tenth."""
STRAGGLER_WINDOW_S = 30.0
"""The arrival rule judges the collectives of the last this many seconds (launcher/watch/straggler.py)."""
TOP_BEHIND_SAY_S = 5.0
"""`inv top` says a rank behind (launcher/watch/arrival.py) once the ranks that entered the collective it never entered
have waited this long in it: each rank's collectives are read once a second at a moment of its own, so in a healthy
run one rank is often a collective behind another at a single look (the recorded healthy gloo run is:
tests/data/collectives/healthy)."""
TOP_BEHIND_HANG_S = 30.0
"""... and takes two looks at every rank's stack once they have waited this long, judged as the hang watch judges them
(launcher/watch/verdict.py: a rank behind at work is no hang), and again this long after (a healthy step, even a slow
rank's, is far shorter; a launch's own hang watch waits HANG_FLOOR_S of no progress at least before it looks)."""
TOP_WHY_GAP = 0.1
"""A flagged rank whose data or forward share of each step is this far above the median rank's is flagged for it: a
narrow view keeps that column (a slow input read 53% against 2% and was dropped at 80 columns)."""
TOP_PIPE_COLUMNS = 200
"""`inv top --once` into a file or pipe is this wide where COLUMNS does not say (a terminal is as wide as it is)."""
TOP_BEHIND_LINES = 3
"""The live view says this many collectives with ranks behind, one a line; more are counted in one line (`--once`
says every one)."""
FORWARD_GAP = 0.1
"""A rank flagged by its forward share (lockstep DDP, launcher/watch/straggler.py) is at least this far above the
median share, besides the straggler factor's ratio: 0.41 against 0.23 is a straggler; 0.03 against 0.02 is noise."""

# `inv doctor --net` (launcher/doctor/net.py; the job is launcher/doctor/netjob.py).
JOB_DOCTOR_PORT_SHIFT = 1
"""`inv doctor --job ID`: the job's own run holds master_port, so the checks and `--net` use this port beside it."""
NET_SIZES = (8, 1 << 20, 16 << 20, 256 << 20)
"""The all_reduce sizes of the whole group, in bytes: the smallest gives the latency, the largest the bandwidth."""
NET_BUDGET_S = 1.0
"""Seconds one size may take (as many runs as fit, at least one); a size over it skips the larger ones."""
NET_PAIR_BYTES = 16 << 20
"""The all_reduce of each pair of neighbours in the ring."""
NET_MAX_ITERS = 20
"""The most runs of one size."""
NET_TIMEOUT_S = 300.0
"""The most the whole measurement may take, from the start of its torchrun to its answer."""


# --- the run's page (launcher.report.page; its node side: launcher/node/agent/series.py) ------------------------------
SERIES = {"interval_s": 5.0, "max_samples": 720, "look_s": 0.5}
"""Each node's time series of its run (the run directory's `series`, kept by the run's supervisor from what `inv top`
reads: the ranks' progress records and /proc, the node's load and memory): a sample every `interval_s`, and at most
`max_samples` of them: past it every other sample goes and the interval doubles, so an hour keeps 5 s samples, a day
80 s ones, and a node's file stays under ~0.5 MB at 8 ranks whatever the run's length (a sample a few hundred
bytes). Until the ranks are up, a look for them every `look_s` (one pass over the run's own processes): the first
sample is their start, so a run shorter than one interval still has its picture."""
REPORT_LOG_TAIL_BYTES = 64 << 10
"""How much of the end of a node's log its `report` answer carries (16 MB at 256 nodes): the failing rank's
traceback and exception line are near the end (a run that went on after its failure, an elastic one, may push them
out: the page then says where the logs are)."""
REPORT_SERIES_BYTES = 1 << 20
"""The most of a node's series its `report` answer carries (SERIES keeps it near half of this at 8 ranks)."""
REPORT_TRACE_BYTES = 256 << 10
"""The most of the end of a node's agent trace (agent.log) its `report` answer carries: written beside the page as
logs/<run id>/<node>.agent.log (a line an event that is no heartbeat: a day's run of few stops and reconnects)."""
REPORT_BACKGROUND_TIMEOUT_S = 300.0
"""The most the page's own process may take after an attached run's end (it opens a session a node, then draws)."""
REPORT_MAX_ROWS = 32
"""A figure draws up to this many ranks (or nodes) one line each; above it, a band (the median, the middle half,
the extremes) with the worst REPORT_NAMED named: 256 nodes stay readable and the page small."""
REPORT_NAMED = 5
"""How many of the worst ranks (slowest step rate) and slowest starting nodes a page names above REPORT_MAX_ROWS."""
REPORT_POINTS = 600
"""The most points a line of the timeline has (longer series are averaged down): a page under 2 MB at 256 nodes."""
