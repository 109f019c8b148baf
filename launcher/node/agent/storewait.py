"""torchrun on a node that joins another node's rendezvous store (stdlib only, Python 3.8+): it imports torch at
once, beside the store holder's own import, and tries the store only once something listens on its port.

Why: torch's store client that finds nothing listening waits out a backoff before it tries again (torch 2.13,
measured: 0.26-0.68 s, median 0.5 s, after a refusal 20 ms early). Every node starts at once, the store holder's
import is no faster than theirs, so about one launch in two lost that backoff, and at N nodes the slowest of N
lotteries sets the start. Checking the port with a plain connection every `store_poll_s` costs at most that much.

The program below runs in the node's own python as `python -c SOURCE HOST PORT LIMIT POLL <torchrun's words>`, and
then runs torch.distributed.run exactly as `-m` does. A refused or timed-out try is tried again until LIMIT; an
address that does not resolve or cannot be reached ends the wait at once, so torchrun itself says what is wrong, as
it would without the wait. (With the doctor on, node 0's agent listened on that port for the TCP check; it lets go
when `go` comes, while this program is still importing torch.)
"""

TORCHRUN = ("-m", "torch.distributed.run")

SOURCE = """\
import runpy, socket, sys, time
try:
    import torch.distributed.launcher.api
except Exception:
    pass
host, port, limit, poll = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
del sys.argv[1:5]
end = time.monotonic() + limit
while time.monotonic() < end:
    try:
        socket.create_connection((host, port), timeout=max(end - time.monotonic(), poll)).close()
        break
    except (ConnectionRefusedError, ConnectionResetError, socket.timeout):
        time.sleep(poll)
    except OSError:
        break
runpy.run_module("torch.distributed.run", run_name="__main__", alter_sys=True)
"""


def waiting_argv(argv, request, limit, poll):
    """torchrun's words for this node: unchanged on the store's holder (node rank 0) and for any other command;
    on every other node, the same torchrun behind the wait for the store's port."""
    if request.get("node_rank") in (None, 0) or tuple(argv[1:3]) != TORCHRUN:
        return list(argv)
    return [
        argv[0],
        "-c",
        SOURCE,
        str(request["master_addr"]),
        str(request["master_port"]),
        repr(limit),
        repr(poll),
        *argv[3:],
    ]
