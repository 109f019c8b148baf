"""The run-time judgments about a running job, in one place: the hang watch (hang.py: when a live run may be stuck;
hangcheck.py: the looks at its stacks; verdict.py: hung or not, from the stacks and NCCL's flight recorder), the
straggler rule (straggler.py), the model behind `inv top` (top.py), and the readings they rest on: a rank's frames
(frames.py), every rank's stacks as an answer (stacks.py), the flight recorder's dumps (flightrec.py).

Pure but for hangcheck.py, which asks the nodes through the run's sessions. report/ renders what is judged here;
run/ carries it out (stops a hung run, tells a straggler).
"""
