"""The fast loop (`python3 -m pytest tests/unit`): no network, no sshd, no torch process; seconds."""
