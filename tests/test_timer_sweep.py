"""The reactor drops cancelled timers while the crawl runs, not minutes later."""

from __future__ import annotations

import asyncio

from scrapy.utils.defer import deferred_f_from_coro_f
from twisted.internet import reactor

from extensions.timer_sweep import TimerSweepExtension


def cancelled_in_heap() -> int:
    # Twisted offers no public view of the cancelled timers its heap still holds
    # (getDelayedCalls leaves them out), and they are what this extension is about.
    return sum(1 for call in reactor._pendingTimedCalls if call.cancelled)


@deferred_f_from_coro_f
async def test_timers_cancelled_by_downloads_leave_the_reactor():
    sweep = TimerSweepExtension(0.05)
    sweep.start()
    try:
        before = cancelled_in_heap()
        # What 1,000 downloads leave: a 180 s timeout and a 240 s pool timer each.
        for delay in (180, 240) * 1000:
            reactor.callLater(delay, lambda: None).cancel()
        # asyncio's clock, as Scrapy's own periodic work uses: no Twisted timer fires.
        await asyncio.sleep(0.3)
        assert cancelled_in_heap() - before < 100
    finally:
        sweep.stop()
