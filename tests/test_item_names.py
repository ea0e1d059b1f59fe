"""Items that cannot have a table of their own: the catalog's tables are never a target,
and fields that one table cannot tell apart are refused; the page and its other items
are stored either way."""

from __future__ import annotations

import contextlib
import sqlite3
import sys

import pytest

from tests import launcher
from tests.checks import actions, catalog_rows
from tests.conftest import ROOT, crawl_env, run_crawl, write_urls
from tests.item_spiders import RESERVED_ITEMS

MODULES = ("-s", "SPIDER_MODULES=spiders,tests.item_spiders")


def query(data_dir, sql: str) -> list[tuple]:
    path = data_dir / "metadata.db"
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as conn:
        return conn.execute(sql).fetchall()


def crawl(tmp_path, data_dir, urls, spider, *args):
    result = run_crawl(
        write_urls(tmp_path / "urls.txt", urls), data_dir, *MODULES, *args, spider=spider
    )
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    return result


def item_errors(data_dir) -> list[dict]:
    return [e for e in actions(data_dir) if e["outcome"] == "item_error"]


def reparse(data_dir, spider, *args):
    return launcher.run(
        [sys.executable, "-m", "scrapy", "reparse", spider, "-s", f"DATA_DIR={data_dir}"]
        + [*MODULES, "--workers", "1", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=crawl_env(),
    )


def artifacts_schema(data_dir) -> list[tuple]:
    return query(data_dir, "SELECT name, type FROM pragma_table_info('artifacts')")


def test_items_named_like_the_catalogs_tables_are_item_errors(site, tmp_path, data_dir):
    urls = [f"{site.base_url}/page/{n}.html" for n in range(10)]
    crawl(tmp_path, data_dir, urls[:5], "shapes")
    schema = artifacts_schema(data_dir)
    assert len(catalog_rows(data_dir)) == 5
    errors = item_errors(data_dir)
    assert len(errors) == 5 * len(RESERVED_ITEMS)
    for cls in RESERVED_ITEMS:
        mine = [e["error"] for e in errors if f"item class {cls.__name__}," in e["error"]]
        assert len(mine) == 5, (cls, errors)
        assert all("'shapes'" in m and "reserved" in m and "table" in m for m in mine), mine
    assert {e["url"] for e in errors} == set(urls[:5])

    # Every run after: the new pages and every other item stored.
    crawl(tmp_path, data_dir, urls, "shapes")
    assert len(catalog_rows(data_dir)) == 10
    assert query(data_dir, "SELECT count(*) FROM page_item") == [(10,)]
    assert query(data_dir, "SELECT count(*), sum(ok) FROM shapes") == [(10, 10)]
    assert artifacts_schema(data_dir) == schema
    assert query(
        data_dir,
        "SELECT count(*) FROM sqlite_master WHERE sql LIKE '%\"url\"%' "
        "AND name NOT IN ('page_item', 'shapes', 'pages_by_url')",
    ) == [(0,)]

    # A plain dict of a spider named like the catalog's table.
    more = [f"{site.base_url}/page/{n}.html" for n in range(10, 13)]
    crawl(tmp_path, data_dir, more, "artifacts")
    mine = [e["error"] for e in item_errors(data_dir) if "'artifacts'," in e["error"]]
    assert len(mine) == 3 and all("item class dict" in m for m in mine), mine
    assert len(catalog_rows(data_dir)) == 13
    assert query(data_dir, "SELECT count(*) FROM page_item") == [(13,)]

    # Parsing again: the same word per item, no traceback, an honest exit.
    result = reparse(data_dir, "shapes")
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    assert result.returncode == 1
    assert "artifacts" in result.stderr and "reserved" in result.stderr
    assert query(data_dir, "SELECT count(*), sum(ok) FROM shapes") == [(13, 13)]
    assert artifacts_schema(data_dir) == schema
    assert len(catalog_rows(data_dir)) == 13


@pytest.mark.parametrize("existing", [False, True], ids=["fresh", "existing"])
def test_fields_that_differ_only_in_case_are_an_item_error(site, tmp_path, data_dir, existing):
    urls = [f"{site.base_url}/page/{n}.html" for n in range(6)]
    before, urls = (urls[:2], urls[2:]) if existing else ([], urls[2:])
    if before:
        crawl(tmp_path, data_dir, before, "shapes", "-a", "shape=plain")
    crawl(tmp_path, data_dir, urls, "shapes", "-a", "shape=case")
    assert len(catalog_rows(data_dir)) == len(before) + 4
    assert query(data_dir, "SELECT count(*) FROM page_item") == [(len(before) + 4,)]
    errors = item_errors(data_dir)
    assert {e["url"] for e in errors} == set(urls)
    for error in errors:
        assert "'Title'" in error["error"] and "'title'" in error["error"], error
    # The items stored before are intact; none of the case shape stored half.
    tables = query(data_dir, "SELECT name FROM sqlite_master WHERE name = 'shapes'")
    assert tables == ([("shapes",)] if before else [])
    if before:
        assert query(data_dir, "SELECT url, title FROM shapes ORDER BY url") == [
            (u, f"Page {u[-6]}") for u in before
        ]
