"""The benchmarks, a package run from the checkout's root (`python -m bench.run`, `inv bench`; a figure alone:
`python -m bench.NAME`). Its modules import `launcher` and each other as `bench.NAME`, nothing of the tests'; the
programs it starts on sandbox nodes are its own files in bench/workloads/, not modules (nothing imports them)."""
