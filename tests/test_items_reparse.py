"""`scrapy reparse` into the item tables: the same rows twice, new items after a fix."""

from __future__ import annotations

import contextlib
import sqlite3
import sys

from scrapy.utils.defer import deferred_f_from_coro_f

from crawler.tools.item_export import export_table
from tests import launcher
from tests.conftest import ROOT, crawl_env, write_urls
from tests.crawls import crawl, crawl_site
from tests.item_spiders import ItemsSpider
from tests.test_items_crash import TABLES

MODULES = ("-s", "SPIDER_MODULES=spiders,tests.item_spiders")


def reparse(data_dir, *args):
    result = launcher.run(
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


@deferred_f_from_coro_f
async def test_reparse_twice_gives_the_same_tables_and_a_fix_replaces_items(
    site, tmp_path, data_dir
):
    urls = [f"{site.base_url}/page/{n}.html" for n in range(40)]
    url_file = write_urls(tmp_path / "urls.txt", urls)
    await crawl(ItemsSpider, data_dir, urls=str(url_file))
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


def catalog(data_dir, *args):
    result = launcher.run(
        [sys.executable, "-m", "scrapy", "catalog", *args, "-s", f"DATA_DIR={data_dir}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env=crawl_env(),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


@deferred_f_from_coro_f
async def test_item_tables_are_listed_and_exported_with_their_types(site, tmp_path, data_dir):
    import pyarrow as pa
    import pyarrow.parquet as pq

    urls = [f"{site.base_url}/page/{n}.html" for n in range(6)]
    await crawl(ItemsSpider, data_dir, urls=str(write_urls(tmp_path / "urls.txt", urls)))
    stats = catalog(data_dir, "stats")
    for table, rows in (("page_item", 6), ("items", 6), ("pages_by_url", 6)):
        assert any(line.split()[:2] == [table, str(rows)] for line in stats.splitlines()), stats

    out = tmp_path / "page_item.parquet"
    catalog(data_dir, "export", "--table", "page_item", "--format", "parquet", "-o", str(out))
    table = pq.read_table(out)
    assert table.num_rows == 6
    assert table.schema.field("words").type == pa.int64()
    assert table.schema.field("title").type == pa.string()
    assert pa.types.is_timestamp(table.schema.field("_parsed_at").type)
    assert sorted(table.column("url").to_pylist()) == sorted(urls)

    # The other formats through what the command calls.
    for fmt in ("csv", "jsonl"):
        out = tmp_path / f"items.{fmt}"
        assert export_table(data_dir, "items", fmt, out) == 6
        assert len(out.read_text().splitlines()) == 6 + (fmt == "csv")


@deferred_f_from_coro_f
async def test_pages_answered_from_the_archive_replace_their_items(site, data_dir):
    starts = [f"{site.base_url}/page/{n}.html" for n in range(3)]
    await crawl_site(starts, data_dir, depth="1", summaries="1")
    first = dump_table(data_dir, "page_summary")
    before = parsed_at(data_dir, starts)
    await crawl_site(starts, data_dir, depth="1", summaries="1")
    # The start pages were answered from the archive and parsed again: their items
    # replaced (newer), none added.
    after = parsed_at(data_dir, starts)
    assert all(after[url] > before[url] for url in starts), (before, after)
    assert dump_table(data_dir, "page_summary") == first
    keys = [row[0] for row in first[1:]]
    assert len(keys) == len(set(keys)) > 3


def parsed_at(data_dir, urls) -> dict[str, str]:
    path = data_dir / "metadata.db"
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as conn:
        marks = ", ".join("?" * len(urls))
        sql = f"SELECT url, _parsed_at FROM page_summary WHERE url IN ({marks})"
        return dict(conn.execute(sql, urls).fetchall())


def dump_table(data_dir, table: str) -> list[tuple]:
    path = data_dir / "metadata.db"
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as conn:
        cols = [r[1] for r in conn.execute(f"PRAGMA table_info({table})") if r[1] != "_parsed_at"]
        sql = f"SELECT {', '.join(cols)} FROM {table} ORDER BY _key, _seq"
        return [tuple(cols)] + conn.execute(sql).fetchall()


@deferred_f_from_coro_f
async def test_damaged_records_are_named_and_their_pages_keep_their_items(site, tmp_path, data_dir):
    urls = [f"{site.base_url}/page/{n}.html" for n in range(8)]
    await crawl(ItemsSpider, data_dir, urls=str(write_urls(tmp_path / "urls.txt", urls)))
    crawled = dump(data_dir)
    with contextlib.closing(sqlite3.connect(data_dir / "metadata.db")) as conn:
        rows = conn.execute('SELECT key, archive, "offset", length FROM artifacts').fetchall()
    rows.sort(key=lambda r: (r[1], r[2]))
    (cut_key, archive, cut_at, length), (bad_key, _, bad_at, bad_length) = rows[-1], rows[2]
    path = data_dir / archive
    with open(path, "r+b") as f:  # one record's gzip member cut, one corrupted
        f.truncate(cut_at + length // 2)
        f.seek(bad_at + bad_length // 2)
        f.write(b"\xff" * 64)
    result = launcher.run(
        [sys.executable, "-m", "scrapy", "reparse", "items", "-s", f"DATA_DIR={data_dir}"]
        + [*MODULES, "--workers", "1", "-a", "variant=v2"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=crawl_env(),
    )
    assert result.returncode == 1, result.stderr[-3000:]
    assert f"{path}: offset {cut_at}: " in result.stderr
    assert f"{path}: offset {bad_at}: " in result.stderr
    assert "error: 2 records skipped" in result.stderr
    # The variant stores no links: the two damaged pages keep theirs, as crawled.
    fixed = dump(data_dir)
    kept = {row[0] for row in fixed["link_out"][1:]}
    assert kept == {cut_key, bad_key}
    assert [r for r in crawled["link_out"][1:] if r[0] in kept] == fixed["link_out"][1:]
