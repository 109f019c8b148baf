"""The run-time judgments about a running job, in one place, all pure: each takes what was seen and the time it is
judged at, and reads no clock, file, process or network of its own.

- hang.py: when a live run may be stuck (no progress for the hang timeout; the timeout learnt from the run);
- verdict.py: hung or not, from two looks at every rank's stack and NCCL's flight recorder (`judge_stacks`, the one
  judgment of the hang watch and `inv top`), with the readings it rests on: frames.py (what a frame waits on),
  stackgroups.py (every rank's stack as the nodes answered, grouped), flightrec.py (the recorder's dumps),
  arrival.py (each group's collectives: who entered last, who is behind);
- straggler.py: the straggler rule;
- topmodel.py: what `inv top` knows of a run and judges at each look.

run/ asks the nodes and carries the judgments out (run/hangcheck.py takes the looks and stops a hung run,
run/topfeed.py feeds `inv top`); report/ renders them.
"""
