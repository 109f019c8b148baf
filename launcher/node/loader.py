"""The node side's importer (stdlib only, Python 3.8+): the node package arrives as sources, nothing is installed.

The launcher runs `PYTHON -c BOOTSTRAP` on a node; the bootstrap execs the first stdin line, which is this file's
source followed by one call, `run(ENTRY, MODULES)` (`launcher.transport.program.node_program`). `run` puts an
importer first on `sys.meta_path` that serves `launcher` and `launcher.node.*` from MODULES (name -> [file name,
source]), so the node modules import each other as they do on the controller, a traceback names the real file
and line (the importer gives linecache the source), and a `launcher` folder in the node's working directory is
never imported instead. Then it runs ENTRY's `main()` and exits with what it returns.
"""

import sys


class NodeImporter:
    """A meta-path finder and loader for the modules the launcher sent (compiled when first imported)."""

    def __init__(self, modules):
        self.modules = modules

    def find_spec(self, name, path=None, target=None):
        if name not in self.modules:
            return None
        from importlib.machinery import ModuleSpec

        filename = self.modules[name][0]
        spec = ModuleSpec(name, self, origin=filename, is_package=filename.endswith("__init__.py"))
        spec.has_location = True  # sets __file__, so tracebacks and the module's own messages name the file
        if spec.submodule_search_locations is not None:
            spec.submodule_search_locations.append(filename.rpartition("/")[0])
        return spec

    def create_module(self, spec):
        return None  # the default module object

    def exec_module(self, module):
        filename, source = self.modules[module.__name__]
        exec(compile(source, filename, "exec"), module.__dict__)

    def get_source(self, name):
        return self.modules[name][1] if name in self.modules else None


def install(modules):
    """Serve `modules` before anything on the node's own path (once: a second bundle adds to the first)."""
    for finder in sys.meta_path:
        if isinstance(finder, NodeImporter) or type(finder).__name__ == "NodeImporter":
            finder.modules.update(modules)
            return finder
    finder = NodeImporter(dict(modules))
    sys.meta_path.insert(0, finder)
    return finder


def run(entry, modules):
    """Install the sent modules, run `entry`'s main(), exit with its code (None: 0)."""
    install(modules)
    import importlib

    sys.exit(importlib.import_module(entry).main())
