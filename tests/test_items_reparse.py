"""`scrapy reparse` into the item tables: the same rows twice, new items after a fix."""

from __future__ import annotations

import contextlib
import sqlite3
import subprocess
import sys

from tests.conftest import ROOT, crawl_env, run_crawl, write_urls
from tests.test_items_crash import TABLES

MODULES = ("-s", "SPIDER_MODULES=spiders,tests.item_spiders")


def reparse(data_dir, *args):
    result = subprocess.run(
        [sys.executable, "-m", "scrapy", "reparse", "items", "-s", f"DATA_DIR={data_dir}"]
        + [*MODULES, "--workers", "2", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=crawl_env(),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def dump(data_dir) -> dict[str, list[tuple]]:
    """Every item table's rows, but for when they were parsed."""
    path = data_dir / "metadata.db"
    out = {}
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as conn:
        for table in TABLES:
            cols = [
                r[1] for r in conn.execute(f"PRAGMA table_info({table})") if r[1] != "_parsed_at"
            ]
            sql = f"SELECT {', '.join(cols)} FROM {table} ORDER BY _key, _seq"
            out[table] = [tuple(cols)] + conn.execute(sql).fetchall()
    return out


def test_reparse_twice_gives_the_same_tables_and_a_fix_replaces_items(site, tmp_path, data_dir):
    urls = [f"{site.base_url}/page/{n}.html" for n in range(40)]
    url_file = write_urls(tmp_path / "urls.txt", urls)
    result = run_crawl(url_file, data_dir, *MODULES, spider="items")
    assert result.returncode == 0, result.stderr[-3000:]
    crawled = dump(data_dir)
    assert len(crawled["link_out"]) > 40

    reparse(data_dir)
    assert dump(data_dir) == crawled
    reparse(data_dir)
    assert dump(data_dir) == crawled

    # The callback changed: its new items only (no links; the dict's new column).
    reparse(data_dir, "-a", "variant=v2")
    fixed = dump(data_dir)
    assert fixed["link_out"][1:] == []
    assert fixed["page_item"] == crawled["page_item"]
    header, *rows = fixed["items"]
    assert "length" in header and len(rows) == 40
    assert all(row[header.index("length")] > 0 for row in rows)

    # -o still writes a file, and leaves the tables alone.
    out = tmp_path / "items.jsonl"
    reparse(data_dir, "-o", str(out))
    assert len(out.read_text().splitlines()) == sum(len(t) - 1 for t in crawled.values())
    assert dump(data_dir) == fixed
