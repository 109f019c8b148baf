"""The hook every worker runs at its start (stdlib only, Python 3.8+): the run directory's `hook/sitecustomize.py`
is this file's source (launcher/node/agent/stackdump.py `install_hook`); imported under its own name it does nothing.

- Stacks: `faulthandler` on a real-time signal writes every thread's stack to `stacks/<pid>.txt` (a forked child,
  a DataLoader worker, opens its own file).
- Progress: with RANK set (a rank and its helpers, not torchrun), an import hook (launcher/node/worker/patches.py) waits
  for the program's own import of `torch.optim.optimizer` and `torch.utils.data.dataloader` (torch itself is never
  imported from here), then counts optimizer steps (torch's global step post hook), batches drawn from DataLoaders
  with the time spent waiting for them, and the time from a batch's arrival (or a step's end) to the next
  `Tensor.backward` call: the forward, pure compute in DDP. They go to `progress/<pid>`, one fixed-size line rewritten
  in place (`os.pwrite`) at most every flush interval (a step or a batch after it writes), and at the end (atexit, and
  destroy_process_group: a program may `os._exit` after it); no thread, no lock. Any failure turns recording off for
  the process and says why in its record; the program goes on as it would without the hook.
- Loss: a `Tensor.backward` on a one-element tensor with no gradient is a loss; the step's value is the sum of its
  backwards' (what a gradient-accumulating loop prints: each micro-batch's loss divided by their count), divided by
  the scale of AMP's GradScaler when the tensor is the one `scale` returned. Read off the hot path: a CPU value at the
  step (no sync to pay), a CUDA one copied at the step into a pinned ring (`non_blocking`, an event recorded) and read
  once its event says it landed (at a flush or the end; never a sync); a step the GradScaler skipped (inf/nan
  gradients: `update` came with no step since the last) is counted, its value dropped. A backward with a gradient,
  a device it does not read, or any failure: no value, and the record says why (loss reading only stops).
- Phases: each rank's start, once a process: the hook's own start (the worker is up), `import torch` done,
  `init_process_group` called (the rendezvous begins) and returned (the process group ready), the first batch and the
  first optimizer step, each a line `NAME WALL RANK LOCAL_RANK RESTART` appended to `phases/<pid>` (six writes in a
  process's life; a step or a batch pays one comparison: the run's page draws its start from them). A forked child
  records none.
- Collectives: with RANK set, a thread reads each process group's collective progress from torch's flight recorder
  into `collectives/<pid>` (launcher/node/worker/collectives.py).

The record: `p2 START on|off T STEPS T_STEP BATCHES T_BATCH FORWARD_S DATA_S LOSS_STEP LOSS LOSS_SUM LOSS_N BAD_STEP BAD
GOOD_STEP GOOD SKIPPED LOSS_STATE [WHY]`, padded with spaces to its size and ended by a newline; START is the
process's start time (/proc/<pid>/stat field 22), the times are CLOCK_MONOTONIC seconds (the same clock for every
process of the node), FORWARD_S and DATA_S totals. LOSS is the last step's value read (LOSS_STEP its step, 0: none
yet), LOSS_SUM and LOSS_N the sum and count of the finite ones (a window's mean is the difference of two records),
BAD the first value that was not finite (nan, inf, -inf; BAD_STEP its step, 0: none) and GOOD the last finite one
before it (GOOD_STEP, 0 and nan: none), SKIPPED the steps GradScaler skipped; values `%.6g` (LOSS_SUM exact: `%r`).
LOSS_STATE: `on` (read), `none` (no backward on a one-element tensor yet), `grad` (backward with a gradient, or on
several elements), `device` (a device not read), `off` (a failure: WHY says which). WHY: why recording is off, else
why the loss is not read.
"""

import os
import sys

STACKS_ENV = "DDP_LAUNCHER_STACKS"
"""What the stacks part reads: `<folder>:<signal number>`."""
PROGRESS_ENV = "DDP_LAUNCHER_PROGRESS"
"""What the progress part reads: `<folder>:<record bytes>:<flush seconds>:<loss ring>`."""
PROGRESS_DIR = "progress"
PHASES_DIR = "phases"
PHASES = (b"hook", b"torch", b"rdzv", b"pg", b"batch", b"step")
"""A rank's start, in order: the hook ran, torch imported, init_process_group called (the script's own setup done:
a trainer's imports, the model), process group ready (the rendezvous over), first batch, first optimizer step."""
COLLECTIVES_ENV, COLLECTIVES_MODULE = "DDP_LAUNCHER_COLLECTIVES", "_ddp_launcher_collectives"
"""The collectives' thread: its setting (`<folder>:<status s>:<arrival s>:<kept per group>:<cost factor>`), its
module's name in the hook's folder (launcher/node/worker/collectives.py, copied there beside this file)."""
COLLECTIVES_DIR = "collectives"
PATCHES_MODULE = "_ddp_launcher_patches"
"""The name in the hook's folder of what patches torch's modules (launcher/node/worker/patches.py, copied there beside
this file)."""
MODULE_NAME = "_ddp_launcher_hook"
"""The name this module also has in sys.modules inside a worker (a job can reach its recorder)."""
VERSION = b"p2"
LOSS_MODULE = "_ddp_launcher_loss"
"""The name in the hook's folder of the loss's reading (launcher/node/worker/loss.py, copied there beside this file)."""


class _NoLossReading:
    """No loss reading (its module is missing): the record says so, the rest goes on."""

    def loss_reset(self):
        self.loss_state, self.loss_why = b"off", b"loss: its module is missing"

    def loss_fields(self):
        return (0, float("nan"), 0.0, 0, 0, float("nan"), 0, float("nan"), 0, b"off")

    def add_loss(self, *_):
        pass

    loss_of_step = scale = update = loss_off = add_loss


def loss_reading():
    """The loss's part of the recorder (launcher/node/worker/loss.py): in a worker the module beside this file in the
    hook's folder, imported as part of the launcher its own (the node's agent, the tests)."""
    import importlib

    for name in (LOSS_MODULE,) if __name__ == "sitecustomize" else (LOSS_MODULE, "launcher.node.worker.loss"):
        try:
            return importlib.import_module(name).LossReading
        except ImportError:
            pass
    return _NoLossReading


def own_start():
    """This process's start time in clock ticks after boot (what the agent knows it by), or -1."""
    try:
        with open("/proc/self/stat") as handle:
            return int(handle.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return -1


class Recorder(loss_reading()):  # type: ignore[misc]
    """One process's progress and its record file (opened at the first write of the process that owns it)."""

    def __init__(self, folder, size, flush_s, clock, ring=0):
        self.folder, self.size, self.flush_s, self.clock = folder, size, flush_s, clock
        self.ring_size = ring  # CUDA values in flight at most (0: none read)
        self.on, self.why = True, b""
        self.loss_state, self.loss_why = b"none", b""  # loss reading: `on`, `none`, `grad`, `device`, `off`
        self.fd, self.start = None, None
        self.phased = set()  # the phases this process has recorded (each once)
        self.reset()

    def phase(self, name):
        """Append `name`'s line to this process's phases file, once: a few microseconds, six times a life."""
        if name in self.phased:
            return
        self.phased.add(name)
        try:
            import time

            env = os.environ
            line = b"%s %.3f %s %s %s\n" % (
                name,
                time.time(),
                env.get("RANK", "-").encode(),
                env.get("LOCAL_RANK", "-").encode(),
                env.get("TORCHELASTIC_RESTART_COUNT", "0").encode(),
            )
            path = os.path.join(os.path.dirname(self.folder), PHASES_DIR, str(os.getpid()))
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_CLOEXEC", 0), 0o600)
            try:
                os.write(fd, line)
            finally:
                os.close(fd)
        except Exception:
            pass  # the start's picture loses a mark; the program and its progress go on

    def reset(self):
        self.steps = self.batches = 0
        self.t_step = self.t_batch = self.forward_s = self.data_s = 0.0
        self.began = None  # when the forward under way began: a batch's arrival or a step's end
        self.written, self.counts_written = None, None
        self.loss_reset()
        self.loss_written = self.loss_fields()

    def forked(self):
        """In a forked child (os.register_at_fork): its own counts, and its own file once it has something to say;
        the parent's descriptor is never written by the child."""
        if self.fd is not None:
            try:
                os.close(self.fd)
            except OSError:
                pass
        self.fd, self.start = None, None
        self.phased = set(PHASES)  # a DataLoader worker's batches are no rank's start
        self.reset()

    def open(self):
        self.start = own_start()
        path = os.path.join(self.folder, str(os.getpid()))
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0), 0o600)

    def write(self, now, loss=True):
        if self.fd is None:
            self.open()
        if loss:
            self.loss_written = self.loss_fields()
        counts = self.steps, self.batches
        line = b"%s %d %s %.3f %d %.3f %d %.3f %.4f %.4f %d %.6g %r %d %d %.6g %d %.6g %d %s %s" % (
            VERSION,
            self.start,
            b"on" if self.on else b"off",
            now,
            self.steps,
            self.t_step,
            self.batches,
            self.t_batch,
            self.forward_s,
            self.data_s,
            *self.loss_written,
            self.why or self.loss_why,
        )
        os.pwrite(self.fd, line[: self.size - 1].ljust(self.size - 1) + b"\n", 0)
        self.written, self.counts_written = now, counts

    def off(self, exc):
        """Recording stops for this process, and its record says why (the program goes on untouched)."""
        self.on = False
        why = "%s: %s" % (type(exc).__name__, exc)
        self.why = " ".join(why.split()).encode("utf-8", "replace")
        try:
            self.write(self.clock())
        except Exception:
            pass

    def step(self, *_):
        """torch's optimizer step post hook: (optimizer, args, kwargs)."""
        if not self.on:
            return
        try:
            now = self.clock()
            self.steps += 1
            self.t_step = self.began = now
            self.stepped = True
            if self.loss_state != b"off":
                self.loss_of_step()
            self.flush(now)
            if self.steps == 1:
                self.phase(b"step")
        except Exception as exc:
            self.off(exc)

    def batch(self, asked):
        """A batch came out of a DataLoader iterator, asked for at `asked`."""
        try:
            now = self.clock()
            self.batches += 1
            self.data_s += now - asked
            self.t_batch = self.began = now
            self.flush(now)
            if self.batches == 1:
                self.phase(b"batch")
        except Exception as exc:
            self.off(exc)

    def flush(self, now):
        """The record written at the first event, then at most every flush interval: a write is the one system
        call the hook makes (a few microseconds in a real loop), and the record carries each count's own time."""
        if self.written is None or now - self.written >= self.flush_s:
            self.write(now)

    def catch_up(self, now):
        """From the collectives' thread (launcher/node/worker/collectives.py): the counts a step or a batch left
        unwritten (a write comes at most every flush interval, and after the last step before a hang nothing comes to
        write them) once nothing has written for two intervals: a hang's record says the steps the rank made. The
        loss's values wait for the next write (they are the main thread's)."""
        quiet = self.written is not None and now - self.written >= 2 * self.flush_s
        if self.on and quiet and (self.steps, self.batches) != self.counts_written:
            try:
                self.write(now, loss=False)
            except Exception:
                pass

    def last(self):
        """At the program's end (atexit): the counts since the last write."""
        if self.on and self.written is not None:
            try:
                self.write(self.clock())
            except Exception:
                pass

    def backward(self, tensor=None, gradient=None):
        """`tensor.backward(gradient)` called: the forward ends; a one-element tensor without a gradient is a loss."""
        try:
            if self.began is not None:
                self.forward_s += self.clock() - self.began
                self.began = None  # a second backward of the same batch is no forward
        except Exception as exc:
            self.off(exc)
        if tensor is not None and self.loss_state != b"off":
            try:
                self.add_loss(tensor, gradient)
            except Exception as exc:
                self.loss_off(exc)


def progress(setting, clock):
    """Start recording progress (`<folder>:<record bytes>:<flush seconds>:<loss ring>`), torch's modules patched as
    the program imports them (launcher/node/worker/patches.py, a module beside this one); the recorder, or None."""
    folder, size, flush_s, ring = setting.rsplit(":", 3)
    recorder = Recorder(folder, int(size), float(flush_s), clock, int(ring))
    try:
        import atexit
        import importlib

        patching = importlib.import_module(PATCHES_MODULE)
        patches = patching.Patches(recorder)
        os.register_at_fork(after_in_child=recorder.forked)
        atexit.register(recorder.last)
        recorder.phase(b"hook")
        for name in patching.WATCHED:
            if name in sys.modules:  # imported before us (a .pth file): patched now
                patches.after(name, sys.modules[name])
        sys.meta_path.insert(0, patching.AfterImport(patching.WATCHED, patches.after, recorder))
    except Exception as exc:
        recorder.off(exc)
    return recorder


def stacks(setting):
    """faulthandler on the signal, into `<folder>/<pid>.txt`; a forked child registers its own file."""
    folder, _, signum = setting.rpartition(":")
    if not folder or not signum.isdigit():
        return
    import faulthandler
    import signal

    def register():
        # The file appears under its name once faulthandler holds it: a look that sees the file finds it answered
        # (a signal between the open and the register met SIG_IGN: an empty file, under a loaded suite).
        path = os.path.join(folder, "%d.txt" % os.getpid())
        handle = open(path + ".new", "a")
        faulthandler.register(int(signum), file=handle, all_threads=True, chain=False)
        os.rename(path + ".new", path)
        globals()["stacks_file"] = handle  # faulthandler keeps only the descriptor

    # Ignored before faulthandler first takes it: Python's exit puts back the action found then, and the default of a
    # real-time signal ends the process (a healthy rank, asked for its stack as it exited, died of signal 41). Once
    # only: a forked child's faulthandler already holds it (registering again changes its file, not its action).
    signal.signal(int(signum), signal.SIG_IGN)
    register()
    os.register_at_fork(after_in_child=lambda: _quietly(register))


def collectives(setting):
    """The thread that reads the rank's collectives (launcher/node/worker/collectives.py, a module beside this one)."""
    import importlib

    watcher = importlib.import_module(COLLECTIVES_MODULE).watch(setting, own_start())
    globals()["collectives_watcher"] = watcher


def _quietly(call):
    try:
        call()
    except Exception:
        pass


def main():
    """What the worker runs first: the stacks, the progress, then the node's own sitecustomize, if it has one."""
    here = os.path.dirname(os.path.abspath(__file__))
    _quietly(lambda: stacks(os.environ.get(STACKS_ENV, "")))
    setting = os.environ.get(PROGRESS_ENV)
    if setting and "RANK" in os.environ:
        try:
            import time

            globals()["recorder"] = progress(setting, time.monotonic)
        except Exception:
            pass  # a setting it cannot read: no record, the program as without us
    setting = os.environ.get(COLLECTIVES_ENV)
    if setting and "RANK" in os.environ:
        _quietly(lambda: collectives(setting))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    ours = sys.modules.pop("sitecustomize", None)
    sys.modules[MODULE_NAME] = ours
    try:
        import sitecustomize  # noqa: F401  (the node's own, if it has one: it runs as it would without us)
    except ImportError as exc:
        if exc.name != "sitecustomize":
            raise
    finally:
        sys.modules.setdefault("sitecustomize", ours)  # the import system takes the module back from here


if __name__ == "sitecustomize":
    main()
