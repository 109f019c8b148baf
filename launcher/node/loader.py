"""The node side's importer (stdlib only, Python 3.8+): the node package arrives as sources, nothing is installed.

The launcher runs `PYTHON -S -c BOOTSTRAP`; the bootstrap execs the first stdin line (zlib-compressed, in base64),
which is this file's source followed by one call, `run(ENTRY, MODULES, CODE)`
(`launcher.transport.program.node_program`). `run` puts an importer first on `sys.meta_path` that serves `launcher`
and `launcher.node.*` from MODULES (name -> [file name, source, digest]; a folder's `__init__.py` is a package, so
`from launcher.node.agent import runner` works), so the node modules import each other as they do on the controller,
a traceback names the real file and line (the importer gives linecache the source), and a `launcher` folder in the
node's working directory is never imported instead. Then it runs ENTRY's `main()` and exits with what it returns.

Compiling the modules a session imports costs ~9 ms of CPU on every node, every session: the compiled code is kept
in the node's cache (CODE: its folder, and how long an entry is kept), one file per module source and interpreter,
named by the source's digest, so a cached entry is always the compiled form of exactly the source that was sent.
"""

import marshal
import os
import sys
import time


def node_path(path):
    """A path as this node means it: `~` is its home, and ~/.cache its XDG cache home when one is set."""
    cache = os.environ.get("XDG_CACHE_HOME")
    if cache and (path == "~/.cache" or path.startswith("~/.cache/")):
        return cache + path[len("~/.cache") :]
    return os.path.expanduser(path)


def interpreter_key():
    """What compiled code depends on besides the source: the interpreter's version and its optimisation level."""
    tag = sys.implementation.cache_tag
    if tag is None:
        return None  # an interpreter without bytecode files: compile every time
    return "%s-%s-O%d" % (tag, "".join(str(part) for part in sys.version_info), sys.flags.optimize)


class CodeCache:
    """Compiled node modules in a folder of the node's cache; never in the way: any failure is a compile."""

    def __init__(self, settings):
        self.key = interpreter_key()
        self.folder = node_path(settings["root"]) if self.key else None
        self.keep_s = settings["keep_s"]
        self.pruned = False

    def path(self, digest):
        return os.path.join(self.folder, "%s.%s.code" % (digest, self.key)) if self.folder else None

    def code(self, filename, source, digest):
        path = self.path(digest)
        if path is not None:
            try:
                with open(path, "rb") as f:
                    return marshal.loads(f.read())
            except (OSError, ValueError, EOFError, TypeError):
                pass  # not there yet (or unreadable): compiled below, and stored
        code = compile(source, filename, "exec")
        if path is not None:
            self.store(path, code)
        return code

    def store(self, path, code):
        # A unique temporary name, then an atomic rename: nodes sharing a home (NFS) may store the same entry at once.
        tmp = "%s.%s.tmp" % (path, os.urandom(4).hex())
        try:
            os.makedirs(self.folder, mode=0o700, exist_ok=True)
            with open(tmp, "wb") as f:
                f.write(marshal.dumps(code))
            os.replace(tmp, path)
        except OSError:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            return
        if not self.pruned:  # a store means a new launcher or interpreter: entries unused since long ago go
            self.pruned = True
            self.prune()

    def prune(self):
        cutoff = time.time() - self.keep_s
        try:
            names = os.listdir(self.folder)
        except OSError:
            return
        for name in names:
            path = os.path.join(self.folder, name)
            try:
                if os.stat(path).st_mtime < cutoff:
                    os.unlink(path)
            except OSError:
                pass


class NodeImporter:
    """A meta-path finder and loader for the modules the launcher sent (compiled, or taken from the code cache,
    when first imported)."""

    def __init__(self, modules, cache):
        self.modules, self.cache = modules, cache

    def find_spec(self, name, path=None, target=None):
        if name not in self.modules:
            return None
        from importlib.machinery import ModuleSpec

        filename = self.modules[name][0]
        spec = ModuleSpec(name, self, origin=filename, is_package=self.is_package(name))
        spec.has_location = True  # sets __file__, so tracebacks and the module's own messages name the file
        if spec.submodule_search_locations is not None:
            spec.submodule_search_locations.append(filename.rpartition("/")[0])
        return spec

    def create_module(self, spec):
        return None  # the default module object

    def exec_module(self, module):
        exec(self.cache.code(*self.modules[module.__name__]), module.__dict__)

    def get_source(self, name):
        return self.modules[name][1] if name in self.modules else None

    def is_package(self, name):
        """A folder's `__init__.py` (`launcher.node.agent`): its module gets `__path__`, so its modules import."""
        if name not in self.modules:
            raise ImportError("no node module %r" % name, name=name)
        return self.modules[name][0].endswith("__init__.py")


def install(modules, code):
    """Serve `modules` before anything on the node's own path (once: a second bundle adds to the first)."""
    for finder in sys.meta_path:
        if isinstance(finder, NodeImporter) or type(finder).__name__ == "NodeImporter":
            finder.modules.update(modules)
            return finder
    finder = NodeImporter(dict(modules), CodeCache(code))
    sys.meta_path.insert(0, finder)
    return finder


def run(entry, modules, code):
    """Install the sent modules, run `entry`'s main(), exit with its code (None: 0)."""
    install(modules, code)
    import importlib

    sys.exit(importlib.import_module(entry).main())
