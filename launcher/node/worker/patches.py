"""torch's modules patched as the program imports them (stdlib only, Python 3.8+): the hook's reach into torch, written
into the run directory's `hook/` beside `sitecustomize.py` (launcher/node/agent/stackdump.py `install_hook`) and
imported by it (launcher/node/worker/hook.py `progress`).

A meta-path finder waits for the program's own import of the watched modules (torch itself is never imported from here)
and hands each one's real loader a wrapper that patches the module once it has executed: the optimizer's step post hook,
DataLoader iterators' `__next__`, `Tensor.backward` (the tensor and its gradient: the loss), GradScaler's `scale` and
`update` (the loss's scale, the steps it skipped), init_process_group and destroy_process_group, each telling the hook's
`Recorder`. The program sees its modules, methods and pickles as without the hook.
"""

import functools
import sys

OPTIMIZER, LOADER, TENSOR = "torch.optim.optimizer", "torch.utils.data.dataloader", "torch._tensor"
TORCH, C10D, SCALER = "torch", "torch.distributed.distributed_c10d", "torch.amp.grad_scaler"
WATCHED = (C10D, OPTIMIZER, LOADER, SCALER, TORCH)
"""The modules whose import the hook waits for (c10d's before torch's end: torch.distributed copies its names)."""


def wrap_next(recorder, original):
    @functools.wraps(original)  # the same name and qualified name: pickling the method finds this one
    def __next__(self):
        if not recorder.on:
            return original(self)
        asked = recorder.clock()
        data = original(self)
        recorder.batch(asked)
        return data

    return __next__


def wrap_group(recorder, module):
    """init_process_group noting when it was called (the rendezvous begins) and returned (the group is ready);
    destroy_process_group writing the record first: train/ddp.py's `os._exit` after it (gloo's last threads) skips
    atexit, which lost its steps since the last flush (a tenth of the demo's on a busy machine, and its page's rate)."""
    init, destroy = module.init_process_group, module.destroy_process_group

    @functools.wraps(init)
    def init_process_group(*args, **kwargs):
        recorder.phase(b"rdzv")
        result = init(*args, **kwargs)
        recorder.phase(b"pg")
        return result

    @functools.wraps(destroy)
    def destroy_process_group(*args, **kwargs):
        recorder.last()
        return destroy(*args, **kwargs)

    module.init_process_group, module.destroy_process_group = init_process_group, destroy_process_group


def wrap_backward(recorder, original):
    @functools.wraps(original)
    def backward(self, *args, **kwargs):
        if recorder.on:
            recorder.backward(self, args[0] if args else kwargs.get("gradient"))
        return original(self, *args, **kwargs)

    return backward


def wrap_scaler(recorder, cls):
    """GradScaler (torch.cuda.amp's and torch.cpu.amp's are its subclasses): `scale` tells the recorder which tensor
    is a loss times which scale, `update` whether the step was skipped (no optimizer step since the last update)."""
    scale, update = cls.scale, cls.update

    @functools.wraps(scale)
    def scaled(self, outputs):
        found = scale(self, outputs)
        if recorder.on:
            recorder.scale(self, outputs, found)
        return found

    @functools.wraps(update)
    def updated(self, *args, **kwargs):
        if recorder.on and getattr(self, "_enabled", True):
            recorder.update()
        return update(self, *args, **kwargs)

    cls.scale, cls.update = scaled, updated


class Patches:
    """What to change in torch's modules as the program imports them, each once."""

    def __init__(self, recorder):
        self.recorder = recorder
        self.done = set()

    def after(self, name, module):
        """`module` was just executed (the program imported it): patch it, and Tensor.backward with it."""
        try:
            if name == OPTIMIZER and name not in self.done:
                self.done.add(name)
                module.register_optimizer_step_post_hook(self.recorder.step)
            elif name == LOADER and name not in self.done:
                self.done.add(name)
                cls = module._BaseDataLoaderIter
                cls.__next__ = wrap_next(self.recorder, cls.__next__)
            elif name == SCALER and name not in self.done:
                self.done.add(name)
                wrap_scaler(self.recorder, module.GradScaler)
            elif name == C10D and name not in self.done:
                self.done.add(name)  # before torch.distributed's `import *` copies it: every caller gets this one
                wrap_group(self.recorder, module)
            elif name == TORCH:
                self.recorder.phase(b"torch")
            tensor = sys.modules.get(TENSOR)
            if tensor is not None and TENSOR not in self.done:
                self.done.add(TENSOR)
                tensor.Tensor.backward = wrap_backward(self.recorder, tensor.Tensor.backward)
            if self.recorder.on and self.recorder.written is None and name in (OPTIMIZER, LOADER):
                self.recorder.write(self.recorder.clock())  # the record exists: the hook is in place
        except Exception as exc:
            self.recorder.off(exc)


class AfterImport:
    """A meta-path finder that hands the real loader of the named modules a wrapper, so `after` runs once the module
    has executed; the module keeps its real loader, as it would without the hook."""

    def __init__(self, names, after, recorder):
        self.names, self.after, self.recorder = names, after, recorder

    def find_spec(self, name, path=None, target=None):
        if name not in self.names:
            return None
        try:
            spec = self.real_spec(name, path, target)
            if spec is None or not hasattr(spec.loader, "exec_module"):
                return None  # nothing to wrap: the import system looks again, as without us
            spec.loader = Loader(spec.loader, name, self.after)
            return spec
        except Exception as exc:
            self.recorder.off(exc)
            return None

    def real_spec(self, name, path, target):
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(name, path, target)
            if spec is not None:
                return spec
        return None


class Loader:
    """The real loader, and `after` once it has executed the module (every other attribute is the real one's)."""

    def __init__(self, loader, name, after):
        self.loader, self.name, self.after = loader, name, after

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        module.__loader__ = self.loader
        module.__spec__.loader = self.loader
        self.loader.exec_module(module)
        self.after(self.name, module)

    def __getattr__(self, name):
        if name == "loader":  # not set yet (a copy): no recursion
            raise AttributeError(name)
        return getattr(self.loader, name)
