"""Under SLURM: the selector every task of an srun step runs first, which picks its node's request."""
