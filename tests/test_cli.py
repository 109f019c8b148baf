"""Wrong command-line input gets one sentence and a non-zero exit, before anything connects or starts."""

from __future__ import annotations

import pytest
from helpers import inv


@pytest.mark.parametrize(("args", "message"), [
    (["launch", "--hosts", "hosts/no-such.yaml"], "hosts/no-such.yaml: no such file"),
    (["launch", "--hosts", "hosts/example.yaml", "--connect-timeout", "soon"],
     "--connect-timeout must be a number of seconds, got 'soon'"),
    (["launch", "--hosts", "hosts/example.yaml", "--grace", "-1"], "--grace must not be negative"),
    (["launch", "--hosts", "hosts/example.yaml", "--args", "'unclosed"], "--args: cannot split"),
    (["launch", "--hosts", "hosts/example.yaml", "--script", "--evil"], "starts with '-'"),
    (["logs", "--hosts", "hosts/example.yaml", "--rank", "three"], "--rank must be a whole number, got 'three'"),
    (["logs", "--hosts", "hosts/example.yaml", "--node", "nope"], "no host named 'nope'"),
    (["sandbox.up", "--nodes", "0"], "--nodes must be at least 1"),
])
def test_bad_options_get_one_sentence(args: list[str], message: str) -> None:
    result = inv(*args, timeout=60)
    assert result.returncode != 0
    assert message in result.stderr, result.stderr
    assert "Traceback" not in result.stderr + result.stdout
