"""What runs on a node (stdlib only, Python 3.8+, nothing installed there): launcher.transport.program sends a
program's sources, only the modules it imports, and loader.py serves them on the node (tracebacks name these files).

folder     runs                                         started by                                       entry
agent/     on every node of a run, in its SSH session   launcher.run (actions.AGENT_SOURCE): launch,     agent.agent
           (an srun task under SLURM); a detached       stop, status, logs, stacks, top, attach, sweep
           run's supervisor after it
worker/    inside every torch worker: the run dir's     the agent writes its files (agent/stackdump.py   (files)
           hook/sitecustomize.py, self-contained        `install_hook`); Python imports it first
probe/     on every node asked: the doctor's probe and  launcher.doctor.collect, and the agent's start   probe.probe
           listener; `ddpl init`'s look (seek.py)       gate; launcher.app.newcluster                    probe.seek
sync/      on every node of `inv sync`, relays too      launcher.sync.push (nodepush)                    sync.syncd
slurm/     first in every task of an srun step          launcher.slurm.step, before the node program     slurm.selector
common/    nowhere by itself: what several programs import (bounds, proc, child, netif, gpus, smi, devices)
loader.py  first in every program: the importer of the sources sent
wire.py    both sides: the messages, the event names, the exit codes and names the controller and the nodes agree
           on; the only module of launcher/node/ the controller imports

Each folder imports wire.py, loader.py and common/ (which imports only those two); agent/ imports probe/ too (the
start gate's checks) and worker/ (the hook it installs), and nothing imports agent/ (tests/unit/test_imports.py).
"""
