"""A load generator for the hub's proxy pool: lease, hold, release in a loop.

Run it in several processes at once against one hub: ``bench_proxies`` measures lease
operations per second with it, and the hub's tests check that no two leases of one
proxy ever overlap under it.

    python -m benchmarks.proxy_churn HUB_URL SECONDS [HOLD_SECONDS [START_AT]]
    # prints the leases done

With START_AT (a wall-clock time), each process connects first and then waits for it, so
that the processes churn together and their start-up stays out of the figure.
"""

from __future__ import annotations

import random
import sys
import time

from crawler.hub import Holder, Hub, ProxyPool, RestPolicy, UsageCounts


def churn(
    url: str, seconds: float, hold_seconds: float = 0.0, ttl: float = 60.0, start_at: float = 0.0
) -> int:
    """Lease, hold up to *hold_seconds*, release, for *seconds*; return the leases done
    (taken and released). A lease is released and the next taken in one call, as a crawl
    process's lease pool rotates when requests wait."""
    rng = random.Random()
    policy = RestPolicy(rest_seconds=0.0, ban_rest_seconds=0.0, jitter=0.0)
    done = 0
    with Hub.open(url) as hub:
        pool = ProxyPool(hub)
        holder = Holder.current()
        time.sleep(max(start_at - time.time(), 0.0))
        deadline = time.monotonic() + seconds
        lease = None
        while time.monotonic() < deadline:
            if lease is None:
                lease = pool.acquire(holder, ttl)
                if lease is None:
                    time.sleep(rng.uniform(0.0005, 0.005))
                    continue
            if hold_seconds:
                time.sleep(rng.uniform(0, hold_seconds))
            released, lease = pool.rotate(
                lease, "rotated", UsageCounts(requests=1), policy, holder, ttl
            )
            done += int(released)
        if lease is not None:
            done += int(pool.release(lease, "rotated", UsageCounts(requests=1), policy))
    return done


if __name__ == "__main__":
    hold = float(sys.argv[3]) if len(sys.argv) > 3 else 0.0
    start = float(sys.argv[4]) if len(sys.argv) > 4 else 0.0
    print(churn(sys.argv[1], float(sys.argv[2]), hold_seconds=hold, start_at=start))
