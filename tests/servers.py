"""Helpers for tests that need a real server or binary."""

from __future__ import annotations

import importlib.util
import os
import socket

import pytest


def need(reason: str) -> None:
    """Skip the test (fail it where REQUIRE_SERVERS=1, as on CI) for a missing server."""
    if os.environ.get("REQUIRE_SERVERS") == "1":
        pytest.fail(reason)
    else:
        pytest.skip(reason)


def need_module(name: str) -> None:
    """need() for a Python package a test cannot run without (psycopg for PostgreSQL)."""
    if importlib.util.find_spec(name) is None:
        need(f"the Python package {name} is not installed (pip install -r requirements.txt)")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that the OS says is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
