"""This checkout's own tools, no part of the installed package (the wheel ships `launcher` alone): the sandbox (N
real sshd "nodes" on loopback addresses, and a SLURM cluster on them), the tasks that need the checkout (`inv
sandbox.up`, `inv demo`, `inv bench`: tasks.py), and what the tests and the bench look at on a sandbox
(observe.py). They import `launcher`; `launcher` imports none of them."""
