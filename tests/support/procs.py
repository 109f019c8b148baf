"""The sandbox's process helpers for tests: `launcher.sandbox.observe`, where bench/ takes them from too."""

from launcher.sandbox.observe import *  # noqa: F403  (its __all__: free ports, subnets, a run's processes)
from launcher.sandbox.observe import __all__ as __all__
