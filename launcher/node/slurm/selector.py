"""The first program of every task of an srun step (stdlib only, Python 3.8+): picks this node's part, runs it.

srun gives all tasks of a step the same stdin. So the launcher sends, after this program (the bootstrap's line),
the node program's source, what every node's request shares, and each node's own part keyed by SLURM_NODEID; this
task puts its request together, checks that
SLURM put it where the plan expects (SLURMD_NODENAME), and runs the program with a stdin that yields that request
first and then the launcher's words as they come. The node program itself does not know it runs under SLURM.
"""

import binascii
import json
import os
import sys
import zlib

from launcher.node.wire import Event, emit


class _Stdin:
    """The node program's stdin: its own request line, then the real stdin's lines."""

    def __init__(self, first, rest):
        self._first = [first]
        self._rest = rest

    def readline(self):
        return self._first.pop() if self._first else self._rest.readline()

    def __iter__(self):
        while self._first:
            yield self._first.pop()
        for line in self._rest:
            yield line


def _fail(message):
    emit(Event.ERROR, message=message)
    sys.exit(2)


def merged(common, own):
    """A node's request: what all requests share, with this node's own part (mappings merged key by key)."""
    request = dict(common)
    for key, value in own.items():
        if isinstance(value, dict) and isinstance(request.get(key), dict):
            request[key] = merged(request[key], value)
        else:
            request[key] = value
    return request


def main():
    source = zlib.decompress(binascii.a2b_base64(sys.stdin.readline()))  # as the bootstrap read this program
    common = json.loads(sys.stdin.readline())
    parts = json.loads(sys.stdin.readline())
    node_id = os.environ.get("SLURM_NODEID")
    part = parts.get(node_id or "")
    if part is None:
        _fail("SLURM_NODEID is %r; the plan has node ids %s" % (node_id, ", ".join(sorted(parts))))
    here = os.environ.get("SLURMD_NODENAME")
    if here and here != part["name"]:
        _fail("SLURM put node id %s on %s, the plan on %s" % (node_id, here, part["name"]))
    sys.stdin = _Stdin(json.dumps(merged(common, part["request"])) + "\n", sys.stdin)
    exec(compile(source, part.get("program", "<node program>"), "exec"), {"__name__": "__main__"})


if __name__ == "__main__":  # as the bootstrap runs it
    main()
