"""Start torchrun on many machines over SSH from one command (`ddpl`, `python -m launcher`, `launcher.api`)."""

__version__ = "0.4.0"
