"""One call per node at once, on daemon threads, with a bound on the whole wait.

`concurrent.futures` pools wait for every worker when they close, and so does the interpreter at exit: a node whose
sshd stopped answering held `inv stop` and `inv status` past their limits, and made the first Ctrl-C seem to do
nothing. Here the caller stops waiting at the limit (what is not done is reported as such) and a Ctrl-C reaches it at
once; the threads left behind are daemons, which never hold the process's exit.
"""

from __future__ import annotations

import math
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")

_JOIN_SLICE = 0.2
"""Seconds between looks at the clock while waiting (a Ctrl-C is seen at once: joins with a timeout are
interruptible)."""


def waves(count: int, workers: int) -> int:
    """How many rounds `count` calls take on `workers` threads."""
    return max(1, math.ceil(count / max(1, workers)))


def parallel(
    fn: Callable[[T], R],
    items: Sequence[T],
    workers: int,
    limit: float | None = None,
    on_done: Callable[[int], None] | None = None,
) -> list[R | BaseException | None]:
    """`fn` over `items` on at most `workers` daemon threads; results in order: a value, the exception it raised,
    or None for a call not done within `limit` seconds (None: no limit). `on_done(count)` after each call ends."""
    results: list[R | BaseException | None] = [None] * len(items)
    todo: queue.SimpleQueue[int] = queue.SimpleQueue()
    for index in range(len(items)):
        todo.put(index)
    lock = threading.Lock()
    ended = [0]

    def work() -> None:
        while True:
            try:
                index = todo.get_nowait()
            except queue.Empty:
                return
            try:
                results[index] = fn(items[index])
            except BaseException as exc:  # the caller decides: a typed failure, not a dead thread
                results[index] = exc
            with lock:
                ended[0] += 1
                count = ended[0]
            if on_done is not None:
                on_done(count)

    threads = [threading.Thread(target=work, daemon=True, name="node-call") for _ in range(min(workers, len(items)))]
    for thread in threads:
        thread.start()
    deadline = None if limit is None else time.monotonic() + limit
    for thread in threads:
        while thread.is_alive():
            left = _JOIN_SLICE if deadline is None else min(_JOIN_SLICE, deadline - time.monotonic())
            if left <= 0:
                return results
            thread.join(left)
    return results
