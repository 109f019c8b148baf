"""The benchmarks, a package run from the checkout's root (`python -m bench.run`, `inv bench`; a figure alone:
`python -m bench.NAME`). Its modules import `launcher` and each other as `bench.NAME`, and nothing from tests/."""
