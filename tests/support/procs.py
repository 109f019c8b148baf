"""The sandbox's process helpers for tests: `bench.observe`, where the bench has them (tests may import the bench;
the bench imports nothing from tests/)."""

from bench.observe import *  # noqa: F403  (its __all__: free ports, subnets, a run's processes)
from bench.observe import __all__ as __all__
