"""The controller's trace: Python's `logging`, under the `launcher` logger (one logger a module,
`logging.getLogger(__name__)`), of what the controller did: connections, the messages it sent and the events it
heard by kind, its decisions and their reasons, its timings.

Every run writes it at debug level to `logs/<run id>/launcher.log` (`run_trace`), whatever the console shows: what
to send with a bug report (docs/troubleshooting.md). `--verbose` (`-v`) shows it on the console too (`verbose`).
Nothing here is printed otherwise: a library's records go where its user's logging sends them.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO

LOGGER = "launcher"
TRACE_FILE = "launcher.log"
"""In each run's folder of logs (`<log_dir>/<run id>/`)."""
FORMAT = "%(asctime)s.%(msecs)03d %(levelname)-5s %(threadName)s %(name)s: %(message)s"
DATE_FORMAT = "%Y-%m-%d %H:%M:%S"

_lock = threading.Lock()
_open: dict[Path, tuple[logging.Handler, int]] = {}
"""The trace files open now, with how many `run_trace` blocks hold each (an attempt inside a launch: one file)."""


def _formatter() -> logging.Formatter:
    return logging.Formatter(FORMAT, DATE_FORMAT)


def _debug_level() -> None:
    """The `launcher` logger passes debug records to its handlers (the root logger's level stays the user's)."""
    logging.getLogger(LOGGER).setLevel(logging.DEBUG)


@contextlib.contextmanager
def run_trace(folder: Path) -> Iterator[Path]:
    """Every record of the controller, at debug level, appended to `folder`/launcher.log while the block runs. One
    file a folder however the blocks nest; a folder that cannot be written to costs the trace, never the run."""
    path = (folder / TRACE_FILE).absolute()
    with _lock:
        handler, holders = _open.get(path, (None, 0))
        if handler is None:
            try:
                folder.mkdir(parents=True, exist_ok=True, mode=0o700)
                handler = logging.FileHandler(path, encoding="utf-8")
            except OSError:
                handler = logging.NullHandler()
            handler.setFormatter(_formatter())
            handler.setLevel(logging.DEBUG)
            logging.getLogger(LOGGER).addHandler(handler)
            _debug_level()
        _open[path] = (handler, holders + 1)
    try:
        yield path
    finally:
        with _lock:
            handler, holders = _open[path]
            if holders > 1:
                _open[path] = (handler, holders - 1)
            else:
                del _open[path]
                logging.getLogger(LOGGER).removeHandler(handler)
                handler.close()


def verbose(stream: IO[str] | None = None) -> logging.Handler:
    """The trace on the console too (`--verbose`): every record of the controller, to `stream` (stderr)."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(_formatter())
    handler.setLevel(logging.DEBUG)
    logging.getLogger(LOGGER).addHandler(handler)
    _debug_level()
    return handler
