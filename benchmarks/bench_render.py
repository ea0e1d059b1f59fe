"""JS rendering: rendered pages/s and peak memory of the whole process tree.

    python -c "from benchmarks.bench_render import run; print(*run(), sep='\\n')"

Crawls 200 of the demo site's /js/N pages (content made by a script) with the site
spider and ``-a render=1``, with 1, 2 and 4 pages rendered in parallel, then the same
pages without rendering, each into a fresh data directory. Pages/s is over the crawl
(first to last stored page, from the action log); memory is the peak, sampled every
0.2 s, of the crawl process and all its descendants (the writer process, Playwright's
driver, Chromium's processes): PSS (shared pages split between processes) and RSS
(shared pages counted in each). Needs Chromium (see docs/how-to/rendering.md); about a minute.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

import psutil

from crawler.render import BrowserNotFoundError, find_browser
from crawler.storage.datadir import DataDir
from demo.site import DemoSite

ROOT = Path(__file__).resolve().parent.parent
PAGES = 200
PARALLEL = (1, 2, 4)


class TreeMemory:
    """Peak PSS and RSS of a process and its descendants, sampled in a thread."""

    def __init__(self, pid: int, interval: float = 0.2):
        self.root = psutil.Process(pid)
        self.interval = interval
        self.peak_pss = self.peak_rss = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.is_set():
            pss = rss = 0
            try:
                procs = [self.root, *self.root.children(recursive=True)]
            except psutil.Error:
                break
            for proc in procs:
                try:
                    info = proc.memory_full_info()
                except psutil.Error:
                    continue
                pss += getattr(info, "pss", info.rss)
                rss += info.rss
            self.peak_pss = max(self.peak_pss, pss)
            self.peak_rss = max(self.peak_rss, rss)
            self._stop.wait(self.interval)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def crawl(base: str, workdir: Path, parallel: int, render: bool) -> dict:
    name = f"render{parallel}" if render else "plain"
    urls = workdir / "urls.txt"
    data_dir = workdir / name
    cmd = [sys.executable, "-m", "scrapy", "crawl", "site", "-a", f"urls={urls}"]
    cmd += ["-s", f"DATA_DIR={data_dir}", "-s", "AUTOTHROTTLE_ENABLED=0", "-s", "LOG_LEVEL=WARNING"]
    if render:
        cmd += ["-a", "render=1", "-s", "RENDER_WAIT=selector=[data-ready]"]
        cmd += ["-s", f"RENDER_MAX_PAGES={parallel}", "-s", f"CONCURRENT_REQUESTS={parallel}"]
    started = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    memory = TreeMemory(proc.pid)
    _, err = proc.communicate(timeout=900)
    memory.stop()
    wall = time.monotonic() - started
    if proc.returncode != 0:
        raise RuntimeError(f"{name}: crawl failed ({proc.returncode}): {err.decode()[-2000:]}")
    times = [
        datetime.fromisoformat(e["ts"].replace("Z", "+00:00")).timestamp()
        for e in map(json.loads, DataDir(data_dir).action_log_path.read_text().splitlines())
        if e["outcome"] == "ok"
    ]
    span = max(times) - min(times)
    return {
        "name": name,
        "pages": len(times),
        "rate": (len(times) - 1) / span if span else float("inf"),
        "wall": wall,
        "pss": memory.peak_pss / 2**20,
        "rss": memory.peak_rss / 2**20,
    }


def run() -> list[str]:
    try:
        browser = find_browser(None) or "Playwright's own Chromium"
    except BrowserNotFoundError as exc:
        return [f"skipped: {exc}"]
    site = DemoSite(pages=PAGES)
    site.start()
    lines = [f"{PAGES} JS pages from 127.0.0.1, {browser}, images blocked"]
    try:
        with tempfile.TemporaryDirectory(prefix="bench-render-") as tmp:
            workdir = Path(tmp)
            (workdir / "urls.txt").write_text(
                "".join(f"{site.base_url}/js/{n}\n" for n in range(PAGES))
            )
            runs = [crawl(site.base_url, workdir, n, True) for n in PARALLEL]
            runs.append(crawl(site.base_url, workdir, 16, False))
    finally:
        site.stop()
    lines.append(
        f"{'run':<10} {'pages':>5} {'pages/s':>8} {'wall s':>7} {'peak PSS MiB':>13} {'peak RSS MiB':>13}"
    )
    for r in runs:
        label = r["name"] if r["name"] == "plain" else f"{r['name'][6:]} page(s)"
        if r["name"] == "plain":
            label = "no render"
        lines.append(
            f"{label:<10} {r['pages']:>5} {r['rate']:>8.1f} {r['wall']:>7.1f} "
            f"{r['pss']:>13.0f} {r['rss']:>13.0f}"
        )
    return lines


if __name__ == "__main__":
    print(*run(), sep="\n")
