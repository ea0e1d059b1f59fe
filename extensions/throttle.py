"""AutoThrottle that takes a 304 for the answer it is.

Scrapy's AutoThrottle never lowers a slot's delay on an answer other than 200, since
error pages and redirects are small and fast and would talk it into going faster. A
304 to a revalidation is the server's whole answer, though: a recrawl of stored pages
with validators is nearly all 304s, and the stock extension kept it at its start delay
(one page a second, whatever the server could take).
"""

from __future__ import annotations

from scrapy.extensions.throttle import AutoThrottle


class RevalidationThrottle(AutoThrottle):
    def _adjust_delay(self, slot, latency: float, response) -> None:
        if response.status == 304:
            response = response.replace(status=200)
        super()._adjust_delay(slot, latency, response)
