"""Scrapy's remote control: off by default and then not even imported (its module imports
aiohttp at every crawl's start); on, Scrapy's own extension."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from scrapy import Spider
from scrapy.extensions.remote_control import RemoteControl as ScrapyRemoteControl
from scrapy.utils.test import get_crawler

from tests.conftest import ROOT, crawl_command, crawl_env, project_settings, write_urls


def imported_modules(stderr: str) -> set[str]:
    """The modules ``python -X importtime`` says a process imported."""
    return set(re.findall(r"^import time:\s+\d+ \|\s+\d+ \|\s*(\S+)$", stderr, re.MULTILINE))


def test_a_crawl_starts_without_importing_the_remote_controls_aiohttp(tmp_path):
    urls = write_urls(tmp_path / "urls.txt", [])
    command = crawl_command(urls, tmp_path / "data")
    command[1:1] = ["-X", "importtime"]
    result = subprocess.run(
        command, cwd=ROOT, env=crawl_env(), capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-3000:]
    modules = imported_modules(result.stderr)
    assert "scrapy.crawler" in modules  # the check reads the list it means to
    assert "aiohttp" not in modules
    assert "scrapy.extensions.remote_control" not in modules
    assert "RemoteControl" not in result.stderr  # nor a "Disabled" warning in the log


def extensions(data_dir: Path, **overrides) -> list:
    crawler = get_crawler(Spider, project_settings(data_dir, **overrides))
    crawler._apply_settings()
    return crawler.extensions.middlewares


def test_remote_control_on_is_scrapys_extension(tmp_path):
    assert not [e for e in extensions(tmp_path) if isinstance(e, ScrapyRemoteControl)]
    found = extensions(tmp_path, REMOTE_CONTROL_ENABLED=True)
    assert [e for e in found if isinstance(e, ScrapyRemoteControl)]
