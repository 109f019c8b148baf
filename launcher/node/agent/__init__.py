"""The run's agent on each node: it starts torchrun, supervises it (attached or detached), stops, sweeps and answers."""
