"""A command asked to read what is not there says so: ``reparse`` over deleted archive
files or a misspelled DATA_DIR exits non-zero naming them (and creates nothing), a crawl
over rows whose archive files are gone warns, and the offline shell on a cut catalog
says so in one line."""

from __future__ import annotations

import os
import subprocess

import pytest
from scrapy.utils.defer import deferred_f_from_coro_f

from tests.checks import catalog_rows
from tests.cmdline import run_scrapy
from tests.conftest import run_crawl, write_urls
from tests.crawls import crawl, crawl_site
from tests.item_spiders import ItemsSpider
from tests.test_item_names import MODULES


def reparse(data_dir, *args):
    return run_scrapy("reparse", "items", "-s", f"DATA_DIR={data_dir}", *MODULES, *args)


@deferred_f_from_coro_f
async def test_reparse_and_crawl_say_which_archive_files_are_missing(site, tmp_path, data_dir):
    urls = [f"{site.base_url}/page/{n}.html" for n in range(5)]
    url_file = write_urls(tmp_path / "urls.txt", urls)
    await crawl(ItemsSpider, data_dir, urls=str(url_file))
    files = sorted({row.archive for row in catalog_rows(data_dir).values()})
    assert files
    for name in files:
        os.unlink(data_dir / name)

    result = reparse(data_dir)
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    assert "missing" in result.stderr and all(name in result.stderr for name in files)

    again = run_crawl(url_file, data_dir, *MODULES, spider="items")
    assert again.returncode == 0, again.stderr[-3000:]
    warning = [line for line in again.stderr.splitlines() if "archive files named by" in line]
    assert len(warning) == 1 and all(name in warning[0] for name in files), again.stderr[-3000:]


def test_reparse_of_a_misspelled_data_dir_creates_nothing(tmp_path):
    wrong = tmp_path / "dta"
    for args in ((), ("-o", str(tmp_path / "out.jsonl"))):
        result = reparse(wrong, *args)
        assert result.returncode == 2, result.stderr[-3000:]
        assert str(wrong) in result.stderr and "does not exist" in result.stderr
        assert "Traceback" not in result.stderr
        assert not wrong.exists()


@deferred_f_from_coro_f
async def test_offline_shell_on_a_cut_catalog_says_so(site, tmp_path, data_dir):
    urls = [f"{site.base_url}/page/{n}.html" for n in range(30)]
    await crawl_site(urls, data_dir)
    catalog = data_dir / "metadata.db"
    with open(catalog, "r+b") as f:
        f.truncate(os.path.getsize(catalog) // 2)
    result = run_scrapy(
        "shell", "-s", "ARCHIVE_SHELL=offline", "-s", f"DATA_DIR={data_dir}", urls[-1], input=""
    )
    said = result.stdout + result.stderr
    assert "Traceback" not in said, said[-3000:]
    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and str(catalog) in errors[0], result.stderr[-3000:]


@deferred_f_from_coro_f
async def test_reparse_of_a_read_only_data_dir_fails_before_parsing(site, tmp_path):
    # Root ignores permission bits: a data directory on a mount made read-only.
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(data_dir)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        urls = [f"{site.base_url}/page/{n}.html" for n in range(5)]
        url_file = write_urls(tmp_path / "urls.txt", urls)
        await crawl(ItemsSpider, data_dir, urls=str(url_file))
        subprocess.run(["mount", "-o", "remount,ro", str(data_dir)], check=True)
        result = reparse(data_dir)
        assert result.returncode == 2, result.stderr[-3000:]
        assert "Traceback" not in result.stderr and "Re-parsed" not in result.stderr
        errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and "read-only" in errors[0] and str(data_dir) in errors[0]
        # Reading it (-o elsewhere) needs no write.
        out = tmp_path / "items.jsonl"
        result = reparse(data_dir, "-o", str(out))
        assert "Traceback" not in result.stderr, result.stderr[-3000:]
    finally:
        subprocess.run(["umount", str(data_dir)], check=True)
