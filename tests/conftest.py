from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from crawler import settings as project
from demo.site import DemoSite

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def site():
    demo = DemoSite(pages=400, page_bytes=3000)
    demo.start()
    yield demo
    demo.stop()


@pytest.fixture
def data_dir(tmp_path) -> Path:
    return tmp_path / "data"


def project_settings(data_dir: Path, **overrides) -> dict:
    """The project's settings for an in-process crawler (``get_crawler``) on ``data_dir``."""
    values = {k: v for k, v in vars(project).items() if k.isupper()}
    values.update(
        DATA_DIR=str(data_dir),
        AUTOTHROTTLE_ENABLED=False,
        PROGRESS_INTERVAL=0,
        LOG_LEVEL="WARNING",
    )
    values.update(overrides)
    return values


def write_urls(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    return path


def crawl_command(urls: str | Path, data_dir: Path, *args: str, spider: str = "site") -> list[str]:
    return [
        sys.executable,
        "-m",
        "scrapy",
        "crawl",
        spider,
        "-a",
        f"urls={urls}",
        "-s",
        f"DATA_DIR={data_dir}",
        "-s",
        "AUTOTHROTTLE_ENABLED=0",
        "-s",
        "LOG_LEVEL=INFO",
        # Tests read counters in Scrapy's stats dump, logged at INFO only then.
        "-s",
        "LOG_QUIET=0",
        *args,
    ]


def run_crawl(urls, data_dir, *args, timeout=180, stdin=None, spider="site", env=None, **kwargs):
    """Run a crawl in a subprocess from the project root; returns the CompletedProcess."""
    return subprocess.run(
        crawl_command(urls, data_dir, *args, spider=spider),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        input=stdin,
        env=env or crawl_env(),
        **kwargs,
    )


def crawl_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT)
    env.pop("SCRAPY_SETTINGS_MODULE", None)
    return env


def start_crawl(urls, data_dir, *args, log_path: Path) -> subprocess.Popen:
    """Start a crawl in its own process group (so a test can kill all of it)."""
    with open(log_path, "w") as log:
        return subprocess.Popen(
            crawl_command(urls, data_dir, *args),
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=crawl_env(),
            start_new_session=True,
        )


def kill_group(proc: subprocess.Popen, sig=signal.SIGKILL) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)
    proc.wait(timeout=60)
