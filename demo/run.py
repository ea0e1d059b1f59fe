"""``make demo``: serve the generated demo site, crawl it, show what the catalog holds.

Needs no network: the site is served on 127.0.0.1 by this process. Run it twice to see
a resumed crawl skip everything already stored.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

from crawler.storage.catalog import Catalog
from crawler.storage.datadir import DataDir
from demo.site import DemoSite

ROOT = Path(__file__).resolve().parent.parent
DATA_DIR = ROOT / "demo-data"


def url_list(base: str, path: Path) -> Path:
    lines = ["# The demo's URL list: start pages, plus a few that fail on purpose."]
    lines += [f"{base}/page/{n}.html" for n in range(0, 3000, 150)]
    lines += [
        f"{base}/redirect/7",
        f"{base}/gzip/8",
        f"{base}/chunked/9",
        f"{base}/latin1/10",
        f"{base}/binary/11",
        f"{base}/missing/12",
        f"{base}/gone/13",
        f"{base}/error/14",
        f"{base}/flaky/15",
        f"{base}/private/16",
        "this line is not a URL",
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


ON_PURPOSE = """\
Some listed URLs fail on purpose, and the log says so:
  /missing/12, /gone/13  404 and 410: final answers, stored (so are the 404s of links)
  /error/14              500 every time: "Gave up retrying" at ERROR, no row, tried again next run
  /flaky/15              503 once, then a page: one retry, then stored
  /private/16            robots.txt forbids it: never fetched, one of the errors the end
                         summary counts ("1 forbidden by robots.txt")
  "this line is not..."  not a URL: "Skipped line" with its line number
"""


def show_catalog(data_dir: Path) -> None:
    datadir = DataDir(data_dir)
    with Catalog(datadir.catalog_path, readonly=True) as catalog:
        summary = catalog.summary()
        types = Counter(
            (row.content_type or "?").split(";")[0] for row in catalog.rows()
        ).most_common(5)
    archives = datadir.archives()
    size = sum(p.stat().st_size for p in archives)
    print("\nWhat the catalog holds")
    print(f"  catalog        {datadir.catalog_path}")
    print(f"  rows           {summary['rows']:,}")
    for status, n in summary["by_status"].items():
        print(f"    status {status:<6} {n:,}")
    for ctype, n in types:
        print(f"    {ctype:<13} {n:,}")
    print(f"  bodies         {summary['bytes'] / 1e6:.1f} MB")
    print(f"  archive        {len(archives)} file(s), {size / 1e6:.1f} MB in {datadir.archive_dir}")
    print(f"  action log     {datadir.action_log_path}")
    print(
        "\nMore: .venv/bin/scrapy catalog stats -s DATA_DIR=demo-data"
        " (and make demo again resumes: nothing is fetched twice)"
    )


def start_site(site: DemoSite) -> str:
    # A fixed port keeps the URLs, and so the keys, the same from run to run: a second
    # `make demo` resumes and fetches nothing.
    try:
        return site.start(int(os.environ.get("DEMO_PORT", "8931")))
    except OSError:
        print("Port busy: serving on another one, so this run cannot resume the last.")
        return site.start(0)


def main() -> int:
    site = DemoSite(pages=3000, page_bytes=4000)
    base = start_site(site)
    print(f"Demo site serving {site.pages} pages at {base}")
    DATA_DIR.mkdir(exist_ok=True)
    urls = url_list(base, DATA_DIR / "urls.txt")
    command = [
        sys.executable, "-m", "scrapy", "crawl", "site",
        "-a", f"urls={urls}", "-a", "depth=3",
        "-s", f"DATA_DIR={DATA_DIR}", "-s", "PROGRESS_INTERVAL=3",
        "-s", "AUTOTHROTTLE_TARGET_CONCURRENCY=8",
    ]  # fmt: skip
    print(ON_PURPOSE)
    print("Running:", " ".join(command[2:]), flush=True)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    code = subprocess.call(command, cwd=ROOT, env=env)
    site.stop()
    show_catalog(DATA_DIR)
    print(f"\nThe crawl exited with status {code} (0: finished, 75: interrupted, 1: failed).")
    return code


if __name__ == "__main__":
    sys.exit(main())
