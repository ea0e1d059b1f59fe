"""Crawl processes of a hub job, and ``scrapy job top`` read as a table: what the
live-view tests share."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests import launcher
from tests.conftest import ROOT, crawl_command, crawl_env, kill_group, write_urls
from tests.hubs import scrapy_with_hub

PERIOD = 2.0  # HEARTBEAT_SECONDS of the crawls here
PAGE_MS = 150  # each page's answer takes this long: a steady rate per process


def start_crawls(hub: str, site, tmp_path: Path, count: int, *args: str) -> list[dict]:
    """*count* crawl processes of job 'watch', each over slow pages of its own."""
    crawls = []
    for k in range(count):
        urls = [f"{site.base_url}/slow/{10000 * k + n}?ms={PAGE_MS}" for n in range(3000)]
        listed = write_urls(tmp_path / f"urls{k}.txt", urls)
        data, log = tmp_path / f"data{k}", tmp_path / f"crawl{k}.log"
        command = crawl_command(
            listed, data, "-s", f"HUB_URL={hub}", "-s", "JOB=watch", "-s", "ROBOTSTXT_OBEY=0",
            "-s", "CONCURRENT_REQUESTS=1", "-s", f"HEARTBEAT_SECONDS={PERIOD}", *args,
        )  # fmt: skip
        proc = launcher.start(command, log=log, cwd=ROOT, env=crawl_env(), new_session=True)
        crawls.append({"proc": proc, "data": data, "log": log})
    return crawls


def stop(crawls: list[dict]) -> None:
    for crawl in crawls:
        if crawl["proc"].poll() is None:
            kill_group(crawl["proc"])


def top(hub: str, *args: str) -> subprocess.CompletedProcess[str]:
    done = scrapy_with_hub("job", "top", *args, hub=hub)
    assert done.returncode == 0, done.stderr
    return done


def process_rows(text: str) -> dict[int, dict[str, str]]:
    """The process table of ``job top``'s plain output: pid -> column -> cell, the
    columns cut where the dashes under the headers say."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("processes (")), None)
    if start is None:  # none reported yet
        return {}
    header, dashes = lines[start + 1], lines[start + 2]
    spans, col = [], 0
    for run in dashes.split("  "):
        spans.append((col, col + len(run)))
        col += len(run) + 2
    names = [header[a:b].strip() for a, b in spans]
    rows = {}
    for line in lines[start + 3 :]:
        if not line.strip():
            break
        cells = {name: line[a:b].strip() for name, (a, b) in zip(names, spans, strict=True)}
        rows[int(cells["pid"])] = cells
    return rows
