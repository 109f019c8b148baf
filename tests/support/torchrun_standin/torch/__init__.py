"""Not torch: the package that holds the tests' stand-in torchrun (`torch/distributed/run.py`). It is found first only
by a node's torchrun, through the PYTHONPATH a sandbox made with `torchrun="stand-in"` gives it; the stand-in takes
its own folder off the PYTHONPATH of the workers it starts, so a worker's `import torch` is the real one."""
