"""`ddpl`, the installed command: Invoke's `Program` over the launcher's tasks (launcher/tasks.py), as Fabric's `fab`
is over its own, with the settings of `launcher.cliconfig` (the project's ddpl.yaml, ~/.ddpl.yaml, DDPL_ variables).

Core options are the ones that mean something here: --help, --list, --version, -f (a settings file),
--config-sources (where each setting came from), --complete and --print-completion-script (Invoke's shell
completion: `source <(ddpl --print-completion-script bash)`), --debug.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from invoke import Argument, Exit, Program

from launcher import __version__
from launcher.cliconfig import DdplConfig, source_lines
from launcher.errors import LauncherError
from launcher.project import find_root

KEPT_CORE = (
    "complete",
    "config",
    "debug",
    "help",
    "list",
    "list-depth",
    "list-format",
    "print-completion-script",
    "version",
    "write-pyc",
)
"""Invoke's core options that `ddpl` keeps; the others are about shell commands a task runs (--echo, --pty, --dry,
--hide, --warn-only, sudo), which the launcher's tasks do not."""


class Ddpl(Program):
    """Invoke's Program with the launcher's collection, its settings and its errors (one sentence, an exit code)."""

    def core_args(self) -> list[Argument]:
        kept = [arg for arg in super().core_args() if arg.name in KEPT_CORE]
        return [
            *kept,
            Argument(
                names=("config-sources",),
                kind=bool,
                default=False,
                help="Say which settings files were read, and where each setting came from.",
            ),
        ]

    def create_config(self) -> None:
        self.config = self.config_class(lazy=True, project_location=find_root())
        self.config.load_base_conf_files()  # /etc/ddpl.yaml, ~/.ddpl.yaml
        self.config.load_project(merge=False)  # the project's ddpl.yaml, once its owner is this user
        self.config.merge()

    def update_config(self, merge: bool = True) -> None:
        runtime = self.args.config.value
        self.config.set_runtime_path(runtime)
        self.config.load_runtime(merge=False)
        if merge:
            self.config.merge()

    def no_tasks_given(self) -> None:
        if not self.args["config-sources"].value:
            super().no_tasks_given()

    def execute(self) -> None:
        if self.args["config-sources"].value:
            config = self.config.clone()
            config.load_collection(self.collection.configuration())
            config.load_shell_env()
            print("\n".join(source_lines(config)))
            if not self.tasks:
                return
        super().execute()

    def print_version(self) -> None:
        import invoke
        import paramiko

        super().print_version()
        print(f"Invoke {invoke.__version__}, Paramiko {paramiko.__version__}, Python {sys.version.split()[0]}")

    def run(self, argv: Any = None, exit: bool = True) -> None:
        try:
            super().run(argv, exit)
        except LauncherError as exc:  # a settings file that cannot be read (or may not be): one sentence
            message, code = f"error: {exc}", getattr(exc, "exit_code", 1) or 1
            if not exit:
                raise Exit(message, code) from None
            print(message, file=sys.stderr)
            sys.exit(code)


def program() -> Ddpl:
    """The `ddpl` program (tests build one to run it in-process)."""
    from launcher.tasks import ns  # its imports switch the garbage collector off while they run

    return Ddpl(name="ddpl", binary="ddpl", version=__version__, namespace=ns, config_class=DdplConfig)


def main() -> None:
    """The `ddpl` console script and `python -m launcher`."""
    try:
        program().run()
    except BrokenPipeError:  # `ddpl launch --help | head`: the reader left; say nothing more, as git does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at the exit's flush
        sys.exit(1)
