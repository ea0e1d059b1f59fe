"""Items land in tables of the catalog database, read back with plain sqlite3."""

from __future__ import annotations

import contextlib
import json
import sqlite3
from datetime import datetime

from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from crawler.storage.items import ItemRow, ItemTableWriter, PageItems
from tests.checks import actions, catalog_rows
from tests.conftest import project_settings, write_urls
from tests.item_spiders import ItemsSpider


def query(data_dir, sql: str, params=()) -> list[tuple]:
    conn = sqlite3.connect(f"file:{data_dir / 'metadata.db'}?mode=ro", uri=True)
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


def columns(data_dir, table: str) -> dict[str, str]:
    return {r[1]: r[2] for r in query(data_dir, f"PRAGMA table_info({table})")}


async def crawl(data_dir, url_file, **kwargs):
    crawler = get_crawler(ItemsSpider, project_settings(data_dir))
    await crawler.crawl_async(urls=str(url_file), **kwargs)
    return crawler


@deferred_f_from_coro_f
async def test_items_of_every_kind_land_in_their_tables(site, tmp_path, data_dir):
    urls = [f"{site.base_url}/page/{n}.html" for n in range(5)]
    url_file = write_urls(tmp_path / "urls.txt", urls)
    await crawl(data_dir, url_file)
    rows = catalog_rows(data_dir)
    assert len(rows) == 5
    key_of = {row.url: key for key, row in rows.items()}

    # scrapy.Item: snake_case class name; declared type; meta columns.
    assert columns(data_dir, "page_item") == {
        "_key": "TEXT",
        "_seq": "INTEGER",
        "_spider": "TEXT",
        "_parsed_at": "TEXT",
        "url": "TEXT",
        "title": "TEXT",
        "words": "INTEGER",
    }
    got = query(data_dir, "SELECT _key, _seq, _spider, url, title FROM page_item")
    assert sorted(got) == sorted((key_of[u], 0, "items", u, f"Page {u[-6]}") for u in urls)
    # To the microsecond, so that a page parsed again within the second reads as newer.
    for (when,) in query(data_dir, "SELECT _parsed_at FROM page_item"):
        datetime.strptime(when, "%Y-%m-%dT%H:%M:%S.%fZ")

    # dict: the spider's table, nested values as JSON text.
    for _key, url, meta in query(data_dir, "SELECT _key, url, meta FROM items"):
        assert key_of[url] == _key
        assert json.loads(meta) == {"status": 200, "tags": ["a", "b"]}

    # dataclass: one row per link, _seq after the two items before them.
    for url in urls:
        html = site.payload(url[len(site.base_url) :]).decode()
        got = query(
            data_dir,
            "SELECT _seq, position, anchors FROM link_out WHERE _key = ? ORDER BY _seq",
            (key_of[url],),
        )
        assert len(got) == html.count("<a ") > 1
        assert [(s, p) for s, p, _ in got] == [(2 + p, p) for p in range(len(got))]
        assert all(len(json.loads(a)) == 1 for _, _, a in got)

    # catalog_table and a natural key.
    pk = query(data_dir, "SELECT name FROM pragma_table_info('pages_by_url') WHERE pk > 0")
    assert pk == [("url",)]
    assert {u for (u,) in query(data_dir, "SELECT url FROM pages_by_url")} == set(urls)


@deferred_f_from_coro_f
async def test_a_new_field_adds_a_column_and_a_bad_value_is_reported(site, tmp_path, data_dir):
    first = [f"{site.base_url}/page/{n}.html" for n in range(3)]
    await crawl(data_dir, write_urls(tmp_path / "a.txt", first))
    assert "length" not in columns(data_dir, "items")

    second = [f"{site.base_url}/page/{n}.html" for n in range(3, 7)]
    crawler = await crawl(
        data_dir, write_urls(tmp_path / "b.txt", second), variant="extra", bad="/5."
    )
    assert "length" in columns(data_dir, "items")
    got = dict(query(data_dir, "SELECT url, length FROM items"))
    assert set(got) == set(first + second) - {second[2]}
    assert [got[u] for u in first] == [None] * 3
    assert all(got[u] > 0 for u in second if u != second[2])

    # The bad page's other items are kept, and the crawl went on.
    bad_key = {row.url: k for k, row in catalog_rows(data_dir).items()}[second[2]]
    assert query(data_dir, "SELECT url FROM page_item WHERE _key = ?", (bad_key,)) == [(second[2],)]
    assert len(catalog_rows(data_dir)) == 7
    errors = [e for e in actions(data_dir) if e["outcome"] == "item_error"]
    assert len(errors) == 1 and errors[0]["key"] == bad_key
    message = errors[0]["error"]
    for part in ("'items'", "dict", "'meta'", second[2], "object"):
        assert part in message, message
    assert crawler.stats.get_value("items/errors") == 1


def test_the_example_spiders_fill_product_and_page_summary(site, tmp_path, data_dir):
    from tests.conftest import run_crawl

    numbers = [3, 14, 21]
    urls = [f"{site.base_url}/product/{n}.html" for n in numbers]
    result = run_crawl(write_urls(tmp_path / "p.txt", urls), data_dir, spider="products")
    assert result.returncode == 0, result.stderr[-3000:]
    got = query(
        data_dir, "SELECT sku, price, old_price, category, colors FROM product ORDER BY sku"
    )
    expected = [site.product(n) for n in numbers]
    assert got == [
        (p["sku"], p["price"], p["old_price"], json.dumps(p["category"]), json.dumps(p["colors"]))
        for p in expected
    ]
    assert columns(data_dir, "product")["price"] == "REAL"

    pages = [f"{site.base_url}/page/{n}.html" for n in range(4)]
    result = run_crawl(write_urls(tmp_path / "s.txt", pages), data_dir, "-a", "summaries=1")
    assert result.returncode == 0, result.stderr[-3000:]
    got = query(data_dir, "SELECT url, status, title FROM page_summary ORDER BY url")
    assert got == sorted((u, 200, f"Page {u[-6]}") for u in pages)


@deferred_f_from_coro_f
async def test_a_failing_callback_releases_its_page_with_the_items_before(site, tmp_path, data_dir):
    urls = [f"{site.base_url}/page/{n}.html" for n in range(4)]
    crawler = await crawl(data_dir, write_urls(tmp_path / "urls.txt", urls), fail="/2.")
    rows = catalog_rows(data_dir)
    assert len(rows) == 4
    broken = {row.url: k for k, row in rows.items()}[urls[2]]
    assert query(data_dir, "SELECT _key FROM page_item WHERE _key = ?", (broken,)) == [(broken,)]
    assert query(data_dir, "SELECT count(*) FROM items WHERE _key = ?", (broken,)) == [(0,)]
    assert query(data_dir, "SELECT count(*) FROM items") == [(3,)]
    assert crawler.stats.get_value("items/pages_reported") == 4


@deferred_f_from_coro_f
async def test_merged_catalogs_keep_the_items_of_the_newest_fetch(site, tmp_path):
    from crawler.storage.itemmerge import prune_items
    from crawler.tools.rebuild import merge_catalogs

    a, b = tmp_path / "a", tmp_path / "b"
    urls = [f"{site.base_url}/page/{n}.html" for n in range(8)]
    await crawl(a, write_urls(tmp_path / "a.txt", urls[:5]))
    await crawl(b, write_urls(tmp_path / "b.txt", urls[3:]), variant="extra")
    out = tmp_path / "merged"
    out.mkdir()
    merge_catalogs([a / "metadata.db", b / "metadata.db"], out / "metadata.db")

    rows = catalog_rows(out)
    assert len(rows) == 8
    got = dict(query(out, "SELECT url, length FROM items"))
    # Pages 3 and 4 were fetched again by b: its items (with the new column) won.
    assert set(got) == set(urls)
    assert [got[u] is None for u in urls] == [True] * 3 + [False] * 5
    for table in ("page_item", "pages_by_url", "items"):
        keys = [k for (k,) in query(out, f"SELECT _key FROM {table}")]
        assert sorted(keys) == sorted(rows), table
    links = query(out, "SELECT _key, count(*), count(DISTINCT _seq) FROM link_out GROUP BY _key")
    assert {k for k, _, _ in links} == set(rows) and all(n == d for _, n, d in links)
    assert query(out, "SELECT count(*) FROM _item_pages") == [(8,)]

    # A shipped copy trimmed of rows loses those pages' items too.
    conn = sqlite3.connect(out / "metadata.db", isolation_level=None)
    try:
        conn.execute("DELETE FROM artifacts WHERE url = ?", (urls[0],))
        assert prune_items(conn) > 0
    finally:
        conn.close()
    gone = {row.url: k for k, row in rows.items()}[urls[0]]
    for table in ("page_item", "items", "link_out", "pages_by_url", "_item_pages"):
        assert query(out, f"SELECT count(*) FROM {table} WHERE _key = ?", (gone,)) == [(0,)]


def test_a_batch_of_pages_is_written_as_one_page_after_the_other(tmp_path):
    """Rows of a batch go in runs of one shape over all pages: the outcome is that of
    writing the pages in order (a page given twice keeps its last items, a natural key
    given twice its last row)."""
    writer = ItemTableWriter(tmp_path / "metadata.db")
    at = "2026-01-01T00:00:00Z"

    def page(key, *rows):
        return PageItems(key, "s", list(rows), at, replace=True)

    def sku(name, price):
        return ItemRow("sku", {"sku": name, "price": price}, natural_key=("sku",))

    a1 = ItemRow("thing", {"n": 1})
    a2 = ItemRow("thing", {"n": 2, "extra": "x"})  # another shape: a new column
    writer.write([page("a", a1, a1, a1), page("b", a1, sku("s1", 1.0))])
    writer.write([page("a", a2), page("b", sku("s1", 2.0)), page("c", sku("s1", 3.0))])
    writer.write([page("a", a1, a1, a1), page("a", a2, a1)])
    conn = writer.catalog.conn
    things = conn.execute("SELECT _key, _seq, n, extra FROM thing ORDER BY _key, _seq").fetchall()
    assert things == [("a", 0, 2, "x"), ("a", 1, 1, None)]
    assert conn.execute("SELECT _key, sku, price FROM sku").fetchall() == [("c", "s1", 3.0)]
    pages = conn.execute("SELECT _key, items FROM _item_pages ORDER BY _key").fetchall()
    assert pages == [("a", 2), ("b", 1), ("c", 1)]
    writer.close()


def test_pages_to_parse_again_follow_their_rows_through_merges_and_trims(tmp_path):
    """A page whose download failed is listed in _incomplete_pages; a merge that takes
    its row takes the listing, a trimmed copy without its row drops it, and the page
    parsed complete leaves the list."""
    from crawler.storage.itemmerge import prune_items
    from crawler.storage.items import incomplete_pages
    from crawler.storage.store import Store, StoreConfig
    from crawler.tools.rebuild import merge_catalogs
    from tests.factories import page_fetch

    def stored(data_dir, *incomplete: bool) -> list:
        store = Store(StoreConfig(data_dir, items=True))
        fetches = [page_fetch(n) for n in range(len(incomplete))]
        for fetch, flag in zip(fetches, incomplete, strict=True):
            store.put(fetch)
            rows = [ItemRow("thing", {"n": 1})]
            store.page_items(PageItems(fetch.key, "s", rows, "t", incomplete=flag))
        store.close()
        return fetches

    a = tmp_path / "a"
    fetches = stored(a, True, False)
    out = tmp_path / "merged"
    out.mkdir()
    merge_catalogs([a / "metadata.db"], out / "metadata.db")
    with contextlib.closing(sqlite3.connect(out / "metadata.db", isolation_level=None)) as conn:
        assert [key for key, _ in incomplete_pages(conn, "s")] == [fetches[0].key]
        conn.execute("DELETE FROM artifacts WHERE key = ?", (fetches[0].key,))
        prune_items(conn)
        assert incomplete_pages(conn, "s") == []
    # Parsed again, complete: off the list.
    writer = ItemTableWriter(a / "metadata.db")
    writer.write([PageItems(fetches[0].key, "s", [ItemRow("thing", {"n": 2})], "u", True)])
    writer.close()
    with contextlib.closing(sqlite3.connect(a / "metadata.db")) as conn:
        assert incomplete_pages(conn, "s") == []
