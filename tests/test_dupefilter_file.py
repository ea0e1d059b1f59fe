"""The duplicate filter's temporary SQLite file lives in SQLITE_TMPDIR and is gone
when the crawl ends: while the crawl runs the file is open in its process, already
deleted from the directory, which stays empty before and after."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.conftest import ROOT, crawl_env, kill_group
from tests.events import wait_until

SPIDER = """
    import scrapy

    class ManySpider(scrapy.Spider):
        name = "many"

        def __init__(self, base, **kwargs):
            super().__init__(**kwargs)
            self.base = base

        async def start(self):
            yield scrapy.Request(self.base + "/page/186.html", callback=self.fan_out)

        def fan_out(self, response):
            # Distinct requests, all scheduled (so fingerprinted) at once; the first
            # ones wait at the site's gate.
            for n in range(3000):
                yield scrapy.Request(f"{self.base}/hold/page/{n % 300}.html?n={n}")

        def parse(self, response):
            yield {"url": response.url}
"""


def open_files_in(pid: int, directory: Path) -> list[str]:
    found = []
    fd_dir = Path(f"/proc/{pid}/fd")
    for fd in fd_dir.iterdir() if fd_dir.exists() else ():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith(f"{directory}/"):
            found.append(target)
    return found


def test_the_filters_temporary_file_is_in_sqlite_tmpdir_and_gone_at_the_end(
    site, tmp_path, data_dir
):
    spider = tmp_path / "many.py"
    spider.write_text(textwrap.dedent(SPIDER))
    tmpdir = tmp_path / "sqlite-tmp"
    tmpdir.mkdir()
    env = {**crawl_env(), "SQLITE_TMPDIR": str(tmpdir)}
    cmd = [
        sys.executable, "-m", "scrapy", "runspider", str(spider), "-a", f"base={site.base_url}",
        "-s", f"DATA_DIR={data_dir}", "-s", "AUTOTHROTTLE_ENABLED=0",
        "-s", "DUPEFILTER_MEMORY_FINGERPRINTS=4", "-s", "DUPEFILTER_CACHE_MIB=0",
        "-s", "CLOSESPIDER_PAGECOUNT=3", "-s", "CONCURRENT_REQUESTS=2",
    ]  # fmt: skip
    site.hold()
    try:
        with open(tmp_path / "crawl.log", "w") as log:
            proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)  # fmt: skip
        try:
            held = wait_until(
                lambda: open_files_in(proc.pid, tmpdir),
                "the filter's file in SQLITE_TMPDIR",
                proc=proc,
            )
            assert all(name.endswith(" (deleted)") for name in held), held
            assert list(tmpdir.iterdir()) == []
        finally:
            site.release()
        code = proc.wait(timeout=120)
    finally:
        kill_group(proc)
    log = (tmp_path / "crawl.log").read_text()
    assert code == 0 and "Spider closed (closespider_pagecount)" in log, log[-3000:]
    assert list(tmpdir.iterdir()) == []
