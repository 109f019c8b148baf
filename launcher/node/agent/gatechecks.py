"""The doctor's fast checks inside an attached run's start session (stdlib only, Python 3.8+): the probe, the master's
listener on master_port, and each node's connection to it, before the node says `ready`."""

import os
import threading
import time

from launcher.node.wire import Event, emit, emit_parts, seconds


def probed(request):
    """The probe's answer: on a container host, from inside the run's image, with the runtime's and the image's own
    facts (launcher/node/probe/image.py); elsewhere from this node's python."""
    if request.get("mode") == "image":
        from launcher.node.probe import image

        return image.look(request)
    from launcher.node.probe import probe

    return probe.probe(request)


class GateChecks:
    """The doctor's fast probe inside the start session (a launch with the doctor on): no session of its own.

    The probe is the node package's own module (launcher/node/probe/probe.py, sent with the agent); the request's
    `gate` section holds every request and number it needs, from the launcher
    (launcher.doctor.request.session_section):
    - probe: what the probe looks at; its answer goes out as the `probed` event (a container host's probe runs
      inside the run's image: the request says so, `probed`);
    - listen (the master only): master_port is bound before the probe (the answer says whether it is free) and
      answers every connection with the token until `go`, `abort` or a stop, and at most max_s;
    - connect: on the launcher's `tcp` message, once every node has probed (so the master's listener is up), this
      node connects to master_addr:master_port and says what it found as the `tcp` event.
    """

    def __init__(self, section, chunk):
        self.section = section
        self.chunk = chunk
        """The longest event line's data (the request's `event_chunk`): srun cuts long lines."""
        self.listener = None  # (thread, the write end of the pipe that stops it, its read end)

    def run(self):
        from launcher.node.probe import listener  # only a launch with the doctor on compiles them

        listen = self.section.get("listen")
        reply = None
        if listen:
            max_s = seconds(listen, "max_s", "listen")
            server, reply = listener.open_listener(listen["master_port"])
            if server is not None:
                stop_r, stop_w = os.pipe()
                thread = threading.Thread(
                    target=listener.serve,
                    daemon=True,
                    name="listener",
                    args=(server, listen["token"], time.monotonic() + max_s, reply, stop_r),
                )
                thread.start()
                self.listener = (thread, stop_w, stop_r)
        # In parts, as every event that can grow: a master's (its probe, its listener's reply, its GPUs) passes the
        # length at which srun cuts a line, and a cut `probed` never arrived (a SLURM launch waited out its probe).
        emit_parts(Event.PROBED, self.chunk, probe=probed(self.section["probe"]), listener=reply)

    def tcp(self):
        from launcher.node.probe.listener import tcp_connect

        connect = self.section["connect"]
        window, read_s = seconds(connect, "window", "connect"), seconds(connect, "token_read_s", "connect")
        probe = self.section["probe"]
        if probe.get("mode") == "image":  # a container host's: the probe's own request is inside
            probe = probe["probe"]
        emit(Event.TCP, tcp=tcp_connect(probe["master_addr"], probe["master_port"], connect["token"], window, read_s))

    def close(self):
        if self.listener is not None:
            thread, stop_w, stop_r = self.listener
            self.listener = None
            os.close(stop_w)
            thread.join()
            os.close(stop_r)
