"""What every torch worker of a run imports first (the run directory's hook/): stacks, progress records, collectives."""
