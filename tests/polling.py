"""Waiting for a condition instead of the clock: the tests' one poll loop.

A test that must act "while the crawl runs" or "once rows are committed" waits here.
The bound only decides when the test gives up, and it fails then, saying what it waited
for; it never decides a pass. Given the process whose progress makes the condition come
true, a wait fails at once when that process exits first: the condition will not come,
and a test that went on as if it had would check nothing.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

BOUND_SECONDS = 120.0


class WaitError(AssertionError):
    """A condition a test waited for did not come."""


def wait_until(
    check: Callable[[], T],
    what: str,
    timeout: float = BOUND_SECONDS,
    proc: subprocess.Popen | None = None,
    step: float = 0.05,
) -> T:
    """Poll ``check`` until it returns something true, and return that.

    With ``proc``, fail if that process exits before ``check`` holds (one last look
    after the exit: what it committed on its way out counts).
    """
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        if proc is not None and proc.poll() is not None:
            found = check()
            if found:
                return found
            raise WaitError(f"waiting for {what}: the process exited ({proc.returncode}) first")
        if time.monotonic() > deadline:
            raise WaitError(f"waiting for {what}: not within {timeout:.0f} s")
        time.sleep(step)


async def wait_until_async(
    check: Callable[[], T], what: str, timeout: float = BOUND_SECONDS, step: float = 0.01
) -> T:
    """:func:`wait_until` inside a test that runs on the reactor: the reactor turns
    between looks (a blocking sleep would stop what makes ``check`` come true)."""
    from scrapy.utils.defer import maybe_deferred_to_future
    from twisted.internet import reactor
    from twisted.internet.task import deferLater

    deadline = time.monotonic() + timeout
    while not (found := check()):
        if time.monotonic() > deadline:
            raise WaitError(f"waiting for {what}: not within {timeout:.0f} s")
        await maybe_deferred_to_future(deferLater(reactor, step))
    return found
