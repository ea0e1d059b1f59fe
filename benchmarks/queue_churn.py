"""A load generator for the hub's work queue: lease a batch, mark it done, until none is
left.

Run it in several processes at once against one queue: ``bench_proxies`` measures URLs
leased and acknowledged per second with it.

    python -m benchmarks.queue_churn HUB_URL QUEUE BATCH START_AT
    # prints the URLs done, and the wall-clock time of the first lease and of the last done

Each process connects, then waits for the wall-clock time START_AT, so that process start-up
stays out of the figure.
"""

from __future__ import annotations

import sys
import time

from crawler.hub import Holder, Hub, WorkQueue


def churn(
    url: str, queue: str, batch: int, start_at: float = 0.0, ttl: float = 300.0
) -> tuple[int, float, float]:
    """From *start_at* on, lease batches of *batch* URLs and mark each done until the
    queue has none pending; return (URLs done, time started, time finished)."""
    done = 0
    with Hub.open(url) as hub:
        work = WorkQueue(hub, queue, create=False)
        holder = Holder.current()
        time.sleep(max(start_at - time.time(), 0.0))
        started = time.time()
        while (leased := work.lease(holder, batch, ttl)) is not None:
            if not work.done(leased):
                raise RuntimeError(f"lease {leased.lease_id} ended before it was done")
            done += len(leased.urls)
    return done, started, time.time()


if __name__ == "__main__":
    print(*churn(sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])))
