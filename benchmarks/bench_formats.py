"""The archive formats side by side: the writer's CPU per page and the bytes on disk.

    python -m benchmarks.bench_formats [--pages 3000] [--page-bytes 20000] [--rounds 3]

Each format stores the demo site's pages (``demo/site.py``) through a :class:`Store`
(archive and catalog, commits every ``CATALOG_BATCH_SIZE`` rows, as the writer process
does in a crawl), in alternating rounds; printed: CPU seconds per 1,000 pages and the
archive's size, each as a ratio to WARC's in the same round. This is the writer
process's share of a crawl, not a whole crawl (``bench_speed.py`` times those).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from crawler.helptext import ToolHelpFormatter
from crawler.storage.datadir import DataDir
from crawler.storage.records import Fetch
from crawler.storage.store import Store, StoreConfig
from demo.site import DemoSite

FORMATS = {
    "warc": ("warc", {}),
    "zip": ("zip", {}),
    "sqlite": ("sqlite", {}),
    "sqlite+gzip6": ("sqlite", {"sqlite_gzip_level": 6}),
}


def fetches(site: DemoSite, pages: int) -> list[Fetch]:
    out = []
    for n in range(pages):
        url = f"http://127.0.0.1/page/{n}.html"
        out.append(
            Fetch(
                key=f"{n:064x}",
                url=url,
                final_url=url,
                method="GET",
                request_headers=[("Accept", "*/*")],
                request_body=b"",
                status=200,
                response_headers=[("Content-Type", "text/html; charset=utf-8")],
                body=site.payload(f"/page/{n}.html"),
            )
        )
    return out


def store_all(name: str, pages: list[Fetch], root: Path) -> tuple[float, int]:
    fmt, options = FORMATS[name]
    config = StoreConfig(data_dir=root / name, format=fmt, format_options=options)
    start = time.process_time()
    store = Store(config)
    for fetch in pages:
        store.put(fetch)
    store.close()
    cpu = time.process_time() - start
    size = sum(p.stat().st_size for p in DataDir(config.data_dir).archives())
    return cpu, size


def main() -> None:
    parser = argparse.ArgumentParser(
        formatter_class=ToolHelpFormatter, description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--pages", type=int, default=3000)
    parser.add_argument("--page-bytes", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    site = DemoSite(pages=args.pages, page_bytes=args.page_bytes, seed=1)
    pages = fetches(site, args.pages)
    body_bytes = sum(len(f.body) for f in pages)
    print(f"{args.pages} pages, {body_bytes / 1e6:.1f} MB of bodies")
    for rnd in range(args.rounds):
        order = list(FORMATS) if rnd % 2 == 0 else list(reversed(FORMATS))
        results = {}
        with tempfile.TemporaryDirectory() as tmp:
            for name in order:
                results[name] = store_all(name, pages, Path(tmp))
        warc_cpu, warc_size = results["warc"]
        for name in FORMATS:
            cpu, size = results[name]
            print(
                f"round {rnd + 1} {name:13s} {cpu / args.pages * 1000:6.2f} s CPU per 1,000 pages "
                f"({cpu / warc_cpu:4.2f}x warc)  {size / 1e6:7.1f} MB ({size / warc_size:4.2f}x warc)"
            )


if __name__ == "__main__":
    main()
