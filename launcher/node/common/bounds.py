"""The node programs' own numbers (stdlib only, Python 3.8+), each in this one place with why it is what it is.

These bound a node program's local work and reads: none is a user's setting or a decision the controller makes.
Every wait of a run's supervision, the heartbeat and the doctor's windows arrive in the request instead (`timing`:
launcher.options.NODE_TIMING, SYNC_TIMING; the doctor's `seconds(...)` sections), so the two sides never disagree.
The few numbers both sides agree on (the events' descriptor, an attach session's exit codes) are in
launcher/node/wire.py; tests/unit/test_defaults.py keeps numbers out of the other node modules.
"""

# --- the doctor's probe (probe, facts) -------------------------------------------------------------------------------
RESOLVE_BUDGET_S = 3.0
"""All of a probe's DNS lookups together: a resolver that answers takes milliseconds; it must fit in connect_timeout."""
SMI_REAP_S = 0.5
"""How long a killed nvidia-smi is waited for before a daemon thread is left to reap it: one stuck in the driver (D
state, a GPU off the bus) ignores SIGKILL, and nothing may wait on it past its bound (the bound itself arrives in the
request: launcher.limits.NVIDIA_SMI_TIMEOUT_S)."""
SMI_MAX_BYTES = 1 << 20
"""The most of an nvidia-smi answer read: a line per GPU, per compute process, per MIG device is a few KiB."""
HASH_BLOCK = 1 << 20
"""Bytes of the job's script read at a time to hash it (few reads, little memory)."""
MODULE_FIND_S = 5.0
"""How long the probe looks for the job's module (`python -m`'s search, a listing of a few folders: milliseconds):
past it a filesystem on the path hangs, which is said (a warning: the module may still import) and not waited on."""
METADATA_HEADER_BYTES = 4096
"""Bytes of a METADATA/PKG-INFO file read for its Name and Version, which come first."""
GPU_BUSY_MIB = 1024
"""Memory in use on a GPU beyond what an idle driver holds (a few hundred MiB): someone's work is on it."""
GPU_BUSY_PERCENT = 5
"""Utilisation beyond an idle GPU's flicker: someone's work is on it."""

IMAGE_OUTPUT_TAIL = 2000
"""Characters of the runtime's output kept when the probe gave no answer inside a container host's image
(launcher/node/probe/image.py): its last lines say why (podman's and runc's errors are a line or two)."""

# --- the doctor's TCP check (listener) -------------------------------------------------------------------------------
HOLDERS_BUDGET_S = 1.0
"""How long the listen mode may scan /proc for who holds a taken port (a node with many processes takes long)."""
CONNECT_TRY_MAX_S = 1.0
"""Each connection attempt's limit within the check's window: long enough for a far master, short enough to retry."""
CONNECT_TRY_MIN_S = 0.2
"""... and at least this, also at the window's end (a last try that may still connect)."""
CONNECT_RETRY_S = 0.05
"""The pause after a refused connection while the master's listener may still be starting."""
TOKEN_MAX_BYTES = 256
"""The most of an answer read as the token (the doctor's is one short line; anything longer is someone else)."""
TOKEN_SEND_S = 1.0
"""How long sending the token to one node may block the listener (a line into an empty socket buffer)."""
LISTEN_BACKLOG = 128
"""Connections waiting to be accepted: every node of a large cluster connects at once."""
DRAIN_BYTES = 4096
"""Bytes read at a time from what the listener only waits to see end (its stop pipe, a node's closed socket)."""
CMDLINE_BYTES = 300
"""How much of a port holder's command line the doctor shows."""

# --- an attached run (agent, attached) ------------------------------------------------------------------------------
UNHEARD_BEFORE_GO_S = 600.0
"""With no heartbeat bound (the default): how long an agent that is ready waits for a launcher it no longer hears
before nothing starts. No process of the run exists yet, only the agent, which must not wait for ever on a launcher
that died with its connection open (a laptop gone from the network)."""
UNREAD_END_S = 600.0
"""With no heartbeat bound: how long an ended run's agent waits for a launcher that stopped reading to take the rest
of the log; a later launcher replays the end from the run directory (launcher/node/agent/attach.py)."""
EVENTS_DRAIN_S = 5.0
"""How long an agent whose run ended waits for its last events (`exited`) to reach a launcher that still reads."""
QUEUED_BEATS_MAX = 100
"""No new beat while this many events wait to be sent: a launcher that reads nothing gets no pile of beats."""
CONSOLE_PIECE = 4096
"""Bytes written to a console's pipe at a time once poll() says it is writable: one page, which a pipe that poll()
calls writable always takes without blocking, so a writer never hangs on a launcher that stopped reading (a laptop
asleep) and can turn to the console that took its place."""
CONSOLE_LOOK_S = 0.5
"""How often a console's writer waiting on a full pipe, or its reader on a quiet one, looks whether the console was
let go (another took its place): the longest a new console waits for the old one's threads to turn to it."""
CONSOLE_BACKLOG = 8
"""Attach sessions waiting for the supervisor to take them: one launcher at a time reconnects."""
HANDOVER_WAIT_S = 5.0
"""How long an attach session waits for the run's supervisor to take its descriptors and answer: a supervisor that does
not within this (stopped, stuck in the kernel) is one the launcher must treat as silent."""
TAKEN_WRITE_S = 0.2
"""How long the supervisor tries to tell its own start session that another launcher took the run over: that session's
launcher may be asleep with a full pipe; it learns it anyway when it tries to reattach."""
LOST_AFTER_CHECKS = 2
"""A followed log's run is lost after this many checks in a row (check_s apart) find no exit code and no process:
the supervisor writes the code a moment after torchrun is gone."""

# --- the run's processes (proc) -------------------------------------------------------------------------------------
PR_SET_CHILD_SUBREAPER = 36
"""prctl's option that makes the supervisor the reaper of its run's orphans (<linux/prctl.h>, Linux 3.4+)."""
TREE_READS = 4
"""Reads of a run's tree until two agree: a process whose parent exits during a read moves up to the reaper, and one
read could see it in neither place."""

TORCHRUN_ALONE_S = 0.5
"""How long a stop lets torchrun shut down by itself once its workers are gone, before it KILLs it: long enough for
its own lines (`Received 15 death signal`, its SignalException traceback) to reach the log on a loaded node (at
40 ms one was cut off before its first line), short of its whole Python shutdown (a second or more, nothing to save).
"""

# --- the workers' progress records (hook, records) -------------------------------------------------------------------
RECORD_BYTES = 256
"""A progress record's fixed size: its numbers take about 80 bytes, the loss's up to ~110 more (LOSS_SUM exact: 24);
the rest holds why recording is off (or why the loss is not read)."""
COLLECTIVES_MAX_BYTES = 1 << 20
"""The most of a rank's collectives file read (launcher/node/worker/collectives.py: ~40 bytes an arrival, 200 per
group)."""
RECORD_FLUSH_S = 0.1
"""The most often a worker rewrites its record (at a step or a batch): one write, some microseconds, a tenth of a
second at most, so a fast loop pays for few; the counts keep their own times, so rates stay exact."""
NONFINITE_LOOK_S = 0.5
"""How often an attached run's agent reads its ranks' records for a loss gone non-finite, to send a beat at once
(launcher/node/agent/attached.py `tick`): a read of a 256-byte file a rank, some microseconds."""
NONFINITE_STOP_MARGIN_S = 5.0
"""Beyond the grace, how long a detached run's supervisor waits, once torchrun ended, for its own stop for a
non-finite loss to finish (its KILLs, the stop's record): it exits after, and a thread of it would die with it."""
LOSS_RING = 64
"""The CUDA losses on their way to the CPU at most (a pinned float each, launcher/node/worker/loss.py): a step whose
slot is still in flight gets no value (never a sync to free one); 64 steps is more than CUDA runs ahead."""

SERIES_JOIN_S = 5.0
"""How long a run's end waits for its series' thread to finish a sample under way (a look at /proc and a few
files: milliseconds) before it takes the last one itself."""

# --- the sync's relay (syncrelay) ------------------------------------------------------------------------------------
RELAY_FIRST_LINE_MAX = 1 << 20
"""The most a relayed stream's first line may hold (the places of the nodes after this one: ~150 bytes each, 256
nodes in 40 kB); a stranger's endless line is not read whole."""

FR_NAMES_ONLY_SINCE = (2, 11)
"""From this torch on the agent sets the flight recorder's TORCH_FR_* names alone: seen on an H100, torch 2.11 reads
them and warns on every rank for each deprecated TORCH_NCCL_* name also set (TRACE_BUFFER_SIZE,
DEBUG_INFO_TEMP_FILE). Older torch gets both names (which one it reads depends on its version)."""

# --- the agent's trace (launcher/node/agent/trace.py) --------------------------------------------------------------
TRACE_MAX_BYTES = 4 << 20
"""The most a run's agent.log grows to on a node: its lines are rare (no heartbeat, no output), so this holds a
long run's whole story; past it, the rest is dropped rather than a disk filled."""
TRACE_PENDING_LINES = 100
"""Lines kept for the trace before the run directory exists (a start that is refused has a handful)."""

# A run's container (launcher/node/agent/container.py)
CONTAINER_CLIENT_S = 5.0
"""How long the runtime's client has to end on TERM (a stop while it pulls the image, a start dropped before `go`)
before it is killed: a pull ends at once, a client that is creating the container a moment later."""
CONTAINER_COMMAND_S = 60.0
"""The bound on one runtime command the agent runs (list, remove): a stopped container is removed in ~0.2 s; a daemon
that does not answer must not hold a stop past this."""
EARLY_COPY_BYTES = 1 << 16
"""Bytes read at a time when what a container's client printed before `go` is copied into the run's log."""
RUNTIME_FAILED = 125
"""A container runtime's client's own failure (docker's and podman's: a bad option, a name in use, no image): its
container may be left, so the run's end removes it by name and label."""

# A run's stacks (launcher/node/agent/stackdump.py)
SOURCE_MAX_BYTES = 4 << 20
"""A job's script larger than this is not copied into the run directory for its stacks' lines (it is no training
script; its frames are judged without their lines where it changed)."""
MTIME_SLACK_S = 0.05
"""A file's mtime and a process's start (in clock ticks of 10 ms) are compared across this much rounding."""
