"""The doctor's look at a container host (stdlib only, Python 3.8+): the node's container runtime, the image there,
and the probe run inside that image, so the doctor reads what the job will see; and `--pull`.

It runs under the host's own Python (`container.host_python`), as the node program `probe.image`. Two modes:
- image: the runtime (launcher/node/common/containers.py `runtime_path`), the image's id and creation time
  (`RUNTIME image inspect`: its `.Id`, the config's digest, the same wherever the image was pulled, loaded or
  imported; never `.Digest`, docs/containers-findings.md), whether this user may use the runtime (`RUNTIME info`,
  asked only when the inspect failed: it tells an image that is not there from a daemon that does not answer); then
  launcher/node/probe/probe.py inside an unnamed `--rm` container of that image, started with the flags every
  container of the launcher gets (`run_words`: the node's network, IPC and pids, the workdir at its path, the GPUs
  the runtime's way, docker as the node's user), behind the host's setup lines in the image's shell, as the run's
  torchrun is: its answer is this program's, with a `container` part added. The TCP check to the master's listener
  is made here, on the host: the container shares its network, so it is the same connection.
- pull: `RUNTIME pull IMAGE`, and the image's id once pulled.

The controller sends every bound (`timeout_s`: the probe_timeout, or the pull_timeout), the probe's program line
and request, and the interpreter's words (launcher.doctor.request.image_request); this program makes up none.
"""

import json
import os
import re
import sys
import time

from launcher.node.common import bounds
from launcher.node.common.containers import NVIDIA_DEVICE, run_words, runtime_kind, runtime_path
from launcher.node.loader import node_path
from launcher.node.wire import BadRequest, probe_answer, seconds

INSPECT_FORMAT = "{{.Id}} {{json .Created}}"
"""The image's id and creation time, alike for podman and docker (`.Created` as JSON: RFC 3339 on both)."""
CDI_FOLDERS = ("/etc/cdi", "/var/run/cdi")
"""Where podman finds the CDI specs that name the NVIDIA devices (`nvidia-ctk cdi generate` writes one)."""


def last_line(*texts):
    """The last line that says something, of the first text that has one (a runtime's own error)."""
    for text in texts:
        lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
        if lines:
            return lines[-1]
    return ""


def command(argv, deadline, data=None):
    """(exit code, stdout, stderr) of a runtime command, given until `deadline` (time.monotonic()); the exit code
    None when it could not start or did not end in time (stderr says which). The client runs in a session of its
    own and is ended with TERM (its signal proxy passes it to a container's process), then KILL past a bound."""
    import subprocess

    left = deadline - time.monotonic()
    if left <= 0:
        return None, "", "no time was left to run %s" % os.path.basename(argv[0])
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE if data is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
    except OSError as exc:
        return None, "", "cannot run %s: %s" % (argv[0], exc)
    try:
        out, err = proc.communicate(data, timeout=left)
    except subprocess.TimeoutExpired:
        proc.terminate()
        try:
            proc.communicate(timeout=bounds.CONTAINER_CLIENT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
        return None, "", "%s %s did not end within %.0f s" % (os.path.basename(argv[0]), argv[1], left)
    return proc.returncode, out.decode("utf-8", "replace"), err.decode("utf-8", "replace")


def inspected(program, image, deadline):
    """{"id", "created"} of the image on this node, or None with the runtime's words (exit code, its last line)."""
    code, out, err = command([program, "image", "inspect", "--format", INSPECT_FORMAT, image], deadline)
    words = out.split(None, 1)
    if code != 0 or not words:
        return None, (code, last_line(err, out) or "exit code %s" % code)
    try:
        created = json.loads(words[1]) if len(words) > 1 else None
    except ValueError:
        created = words[1].strip()
    return {"id": words[0], "created": created if isinstance(created, str) else None}, None


def cdi_specs():
    """The CDI spec files podman would read (their names), for a node with NVIDIA devices."""
    found = []
    for folder in CDI_FOLDERS:
        try:
            found += [os.path.join(folder, name) for name in sorted(os.listdir(folder))]
        except OSError:
            continue
    return found


def runtime_facts(spec, deadline):
    """What the doctor says of the node's runtime and image: which runtime, usable or why not, the image's id and
    creation time or the runtime's words on why it is not there; and the program, when the image can be run."""
    wanted = "podman or docker" if spec.get("runtime", "auto") == "auto" else spec["runtime"]
    facts = {"image": spec["image"], "wanted": wanted, "runtime": None, "nvidia_device": os.path.exists(NVIDIA_DEVICE)}
    program = runtime_path(spec)
    if program is None:
        return facts, None
    facts.update(runtime=program, kind=runtime_kind(program))
    if facts["nvidia_device"] and facts["kind"] == "podman":
        facts["cdi"] = cdi_specs()
    image, why = inspected(program, spec["image"], deadline)
    if image is not None:
        facts.update(usable=True, present=True, **image)
        return facts, program
    code, out, err = command([program, "info"], deadline)
    if code != 0:
        facts.update(usable=False, unusable=last_line(err, out) or "`%s info` exit code %s" % (wanted, code))
        return facts, None
    facts.update(usable=True, present=False, missing=why[1])
    return facts, None


def probe_inside(request, program, deadline):
    """The probe's answer from inside the image (None), or (None, why it gave none: exit code and output)."""
    spec = dict(request["container"], pull="never")  # the image just inspected, never another one pulled meanwhile
    workdir = request["workdir"]
    mounted = [workdir] if os.path.isdir(node_path(workdir)) else []
    inner = list(request["python_argv"])
    if spec.get("script"):
        inner = ["/bin/sh", "-c", spec["script"], "ddpl-setup", *inner]
    # A workdir the host lacks: the probe starts in / (the runtime refuses a missing one) and says it is missing.
    argv = run_words(program, spec, workdir if mounted else "/", mounted) + inner
    data = (request["program"] + "\n" + json.dumps(request["probe"]) + "\n").encode()
    code, out, err = command(argv, deadline, data)
    answer = probe_answer(out)
    if code == 0 and answer is not None and "error" not in answer:
        return answer, None
    return None, {
        "exit_code": -1 if code is None else code,
        "stderr": err[-bounds.IMAGE_OUTPUT_TAIL :],
        "stdout": out[-bounds.IMAGE_OUTPUT_TAIL :],
    }


def look(request):
    """Mode image: the node's runtime and image, and the probe's answer from inside it, as one JSON object."""
    started = time.monotonic()
    deadline = started + seconds(request, "timeout_s", "image")
    connect = request.get("connect")
    if connect:
        window, read_s = seconds(connect, "window", "connect"), seconds(connect, "token_read_s", "connect")
    facts, program = runtime_facts(request["container"], deadline)
    reply = {"mode": "probe"}
    if program is not None:
        began = time.monotonic()
        answer, failed = probe_inside(request, program, deadline)
        facts["probe_s"] = round(time.monotonic() - began, 3)
        if answer is not None:
            reply = answer
        else:
            facts["probe_failed"] = failed
    reply["container"] = facts
    if connect:  # on the host: the container's network is the host's, and this holds whatever the image did
        from launcher.node.probe.listener import tcp_connect

        probe = request["probe"]
        reply["tcp"] = tcp_connect(probe["master_addr"], probe["master_port"], connect["token"], window, read_s)
    reply["elapsed"] = round(time.monotonic() - started, 3)
    reply.setdefault("time", time.time())
    return reply


def pull(request):
    """Mode pull: `RUNTIME pull IMAGE` within the request's bound; the image's id once pulled, or the runtime's own
    last line."""
    started = time.monotonic()
    deadline = started + seconds(request, "timeout_s", "pull")
    spec = request["container"]
    program = runtime_path(spec)
    if program is None:
        wanted = "podman or docker" if spec.get("runtime", "auto") == "auto" else spec["runtime"]
        return {"pulled": False, "runtime": None, "error": "no %s on PATH" % wanted}
    code, out, err = command([program, "pull", spec["image"]], deadline)
    took = round(time.monotonic() - started, 3)
    if code != 0:
        return {"pulled": False, "runtime": program, "seconds": took, "error": last_line(err, out) or "exit %s" % code}
    image, _ = inspected(program, spec["image"], deadline)
    if image is None:  # a reference of a transport (docker-archive:...) names no local image: podman said its id
        found = last_line(out)
        image = {"id": found if re.match(r"(sha256:)?[0-9a-f]{64}$", found) else None}
    return {"pulled": True, "runtime": program, "seconds": took, "id": image.get("id")}


def main():
    request = json.loads(sys.stdin.readline())
    mode = request.get("mode")
    try:
        reply, code = (pull(request) if mode == "pull" else look(request)), 0
    except BadRequest as exc:  # the controller's bug, said as one line
        reply, code = {"mode": mode, "error": str(exc)}, 2
        sys.stderr.write("image: %s\n" % exc)
    sys.stdout.write(json.dumps(reply) + "\n")
    sys.stdout.flush()
    return code


if __name__ == "__main__":
    sys.exit(main())
