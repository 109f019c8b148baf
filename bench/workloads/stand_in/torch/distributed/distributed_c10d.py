"""A stand-in for torch's collective, for the hang figure's light job (no torch there): a rank that waits in it has
a frame where torch's all_reduce has one, so the launcher's verdict sees a rank waiting for its peers."""

import time


def all_reduce(seconds):
    time.sleep(seconds)  # as a collective whose peer never comes
