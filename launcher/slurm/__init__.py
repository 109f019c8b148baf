"""The same plan and supervision under SLURM: a run as one srun step of an allocation, batch jobs by job id."""
