"""Submitting crawls with ``slurm/submit`` and reading what they left, as a user would.

Shared by the tests that run the project on the real single-node cluster of
tests/slurm_cluster.py: the shared data directory is read with sqlite3 and the logs as
text; nothing here imports the project.
"""

from __future__ import annotations

import re
import sqlite3
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

from tests.conftest import ROOT

FAST = ["-s", "AUTOTHROTTLE_ENABLED=0"]


def submit(cluster, urls: Path, data: Path, tasks: int, tmp_path: Path, procs: int = 1,
           env: dict | None = None, scrapy_args: list[str] = FAST,
           partition: str | None = None) -> tuple[str, str]:  # fmt: skip
    """Submit the array and its merge job; returns their job ids. ``partition``:
    ``--partition-by`` (the test site is one host: ``url`` splits it)."""
    local = tmp_path / "local"
    local.mkdir(exist_ok=True)
    job_env = dict(cluster.env, LOCAL=str(local), SHIP_EVERY="0.05", **(env or {}))
    cmd = [sys.executable, str(ROOT / "slurm" / "submit"), str(urls), "--tasks", str(tasks),
           "--procs", str(procs), "--data", str(data), "--time", "10:00", "--margin", "60",
           *(["--partition-by", partition] if partition else []),
           "--", *scrapy_args]  # fmt: skip
    done = subprocess.run(cmd, env=job_env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    array, merge = re.search(r"crawl array (\d+) .* merge job (\d+)", done.stdout).groups()
    return array, merge


def shipped_urls(data: Path) -> dict[str, list[str]]:
    """URL -> the shipped catalogs (file names) holding a row for it."""
    out: dict[str, list[str]] = {}
    for db in sorted((data / "catalogs").glob("*.db")):
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            for (url,) in conn.execute("SELECT url FROM artifacts"):
                out.setdefault(url, []).append(db.name)
        finally:
            conn.close()
    return out


def logs(data: Path) -> str:
    return "\n".join(p.read_text(errors="replace") for p in sorted((data / "logs").glob("*")))


def served(site, urls: list[str]) -> dict[str, int]:
    """URL -> how many times the site answered it."""
    return {u: site.counts[urlsplit(u).path] for u in urls}
