"""Duplicate filter: memory and time per request, Scrapy's against the project's.

    python -m benchmarks.bench_dupefilter [--requests 3000000]

Each filter runs in its own process, fed the same distinct requests (URLs of one
host with a query, as a long list is); peak RSS above the process's start is what
the filter kept. The project's filter moves fingerprints to a temporary SQLite file
every DUPEFILTER_MEMORY_FINGERPRINTS (the project's default unless --memory says
otherwise). Takes about a minute per million requests.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from crawler.helptext import ToolHelpFormatter

ROOT = Path(__file__).resolve().parent.parent

FEED = """
import json, resource, sys, time
from scrapy import Request
from scrapy.utils.request import RequestFingerprinter
from scrapy.dupefilters import RFPDupeFilter
from extensions.dupefilter import SpillingDupeFilter

def rss_mb():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 / 1e6

kind, requests, memory = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
fingerprinter = RequestFingerprinter()
if kind == "scrapy":
    dupes = RFPDupeFilter(fingerprinter=fingerprinter)
else:
    dupes = SpillingDupeFilter(fingerprinter=fingerprinter, memory_fingerprints=memory)
start = rss_mb()
spent = 0.0
clock = time.perf_counter
for n in range(requests):
    request = Request(f"http://127.0.0.1:8080/p{n % 5000}.html?v={n}")
    t = clock()
    seen = dupes.request_seen(request)
    spent += clock() - t
    assert not seen
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1000
print(json.dumps({"us": spent / requests * 1e6, "kept_mb": peak - start}))
"""


def measure(kind: str, requests: int, memory: int) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", FEED, kind, str(requests), str(memory)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout)


def run(requests: int = 3_000_000, memory: int | None = None) -> list[str]:
    if memory is None:
        from crawler import settings

        memory = settings.DUPEFILTER_MEMORY_FINGERPRINTS
    scrapy, ours = measure("scrapy", requests, memory), measure("spilling", requests, memory)
    return [
        f"{requests:,} distinct requests; fingerprints kept in memory up to {memory:,}",
        f"{'filter':<34} {'us/request':>10} {'memory MB':>10}",
        f"{'Scrapy RFPDupeFilter':<34} {scrapy['us']:10.2f} {scrapy['kept_mb']:10.0f}",
        f"{'SpillingDupeFilter':<34} {ours['us']:10.2f} {ours['kept_mb']:10.0f}",
        f"ratio (ours / Scrapy's): time {ours['us'] / scrapy['us']:.2f}, "
        f"memory {ours['kept_mb'] / scrapy['kept_mb']:.2f}",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(
        formatter_class=ToolHelpFormatter, description=__doc__.splitlines()[0]
    )
    parser.add_argument("--requests", type=int, default=3_000_000)
    parser.add_argument("--memory", type=int, default=None)
    args = parser.parse_args()
    print(*run(args.requests, args.memory), sep="\n")


if __name__ == "__main__":
    main()
