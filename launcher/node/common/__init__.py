"""The node modules several programs import (bounds, processes, torchrun's start, the interface, the GPUs)."""
