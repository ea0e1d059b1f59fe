"""``make bench``: every benchmark of the project, in one run."""

from __future__ import annotations

import importlib
import sys

SECTIONS = [
    (
        "Speed as a user sees it: scrapy crawl site against a bare Scrapy spider (issue 13)",
        "benchmarks.bench_speed",
    ),
    ("Crawl: storage stack against a bare crawl (nginx, 40-60 KB pages)", "benchmarks.bench_crawl"),
    (
        "Every core pays: CPU per page of slurm.task, two crawls on two cores (20,000 pages)",
        "benchmarks.bench_cores",
    ),
    (
        "Resume: a warm re-run of a 1,000,000-URL list, all stored (builds it once: ~5 min)",
        "benchmarks.bench_resume",
    ),
    (
        "Revalidation of 500 stored pages (304s) against a bare spider (200s)",
        "benchmarks.bench_revalidate",
    ),
    (
        "Revisits: archive growth of a second crawl of 1,000 pages without validators, speed",
        "benchmarks.bench_revisits",
    ),
    ("Duplicate filter: Scrapy's against the project's", "benchmarks.bench_dupefilter"),
    ("Catalog lookups with 10 million rows (builds it: ~7 min)", "benchmarks.bench_lookup"),
    ("Proxy leases", "benchmarks.bench_proxies"),
    (
        "Heartbeats: the hub's cost with 40 processes, a crawl with them on and off",
        "benchmarks.bench_heartbeats",
    ),
    ("Re-parse and random access", "benchmarks.bench_reparse"),
    (
        "Re-parse against a plain loop calling the parser (3,000 pages, whole processes)",
        "benchmarks.bench_reparse_loop",
    ),
    ("JS rendering (Chromium, 200 pages)", "benchmarks.bench_render"),
    ("Crawl report from a 1,000,000-line action log", "benchmarks.bench_report"),
    ("Item tables: writer, pipeline, --follow", "benchmarks.bench_items"),
    (
        "Archive formats: crawl speed and size of warc, sqlite, sqlite+gzip against the bare spider",
        "benchmarks.bench_format_speed",
    ),
]


def main() -> int:
    failed = 0
    for title, module in SECTIONS:
        print(f"\n== {title} ({module})", flush=True)
        try:
            lines = importlib.import_module(module).run()
        except Exception as exc:  # one section failing should not hide the others
            failed += 1
            print(f"failed: {type(exc).__name__}: {exc}", flush=True)
            continue
        for line in lines:
            print(line, flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
