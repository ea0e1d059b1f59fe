"""The live views of a cluster crawl: every crawl process of a job, from the heartbeats
it writes to the hub (``crawler/hub/heartbeats.py``, ``extensions/heartbeat.py``).

- ``model``: what the views show (states, totals, ETA, hosts, proxies), testable alone.
- ``source``: what they read from the hub, creating nothing.
- ``terminal``: ``scrapy job top`` (Rich; plain lines when not a terminal).
- ``page``, ``server``: ``scrapy job serve`` (the report's look, read-only HTTP).
"""
