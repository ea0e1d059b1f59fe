"""The ``products`` example spider: its parser against the demo shop's known facts."""

from __future__ import annotations

import sys

import pyarrow.parquet as pq
import pytest
from scrapy.http import HtmlResponse, Request
from scrapy.utils.defer import deferred_f_from_coro_f

from crawler.spiderkit.parsers import hrefs, page_summary
from demo.site import DemoSite
from spiders.products import ProductsSpider, parse_product
from tests import launcher
from tests.cmdline import read_jsonl
from tests.conftest import ROOT, crawl_env, write_urls
from tests.crawls import crawl

SHOP = DemoSite(pages=100, page_bytes=8000, seed=3)


def response(path: str, body: bytes) -> HtmlResponse:
    url = f"http://shop.test{path}"
    return HtmlResponse(url, body=body, request=Request(url), encoding="utf-8")


@pytest.mark.parametrize("n", [0, 3, 7, 14, 99])
def test_parser_extracts_what_the_page_says(n):
    facts = SHOP.product(n)
    item = parse_product(response(f"/product/{n}.html", SHOP.product_html(n)))
    assert item is not None
    for name in (
        "sku", "name", "brand", "price", "old_price", "currency", "availability",
        "rating", "review_count", "category", "colors", "sizes", "seller",
    ):  # fmt: skip
        assert getattr(item, name) == facts[name], name
    assert item.related == [f"http://shop.test/product/{k}.html" for k in facts["related"]]
    assert item.images == [f"http://shop.test/img/{facts['sku']}-{i}.jpg" for i in range(3)]
    assert item.specs == {"SKU": facts["sku"], "Brand": facts["brand"], "Weight": "1.2 kg"}
    assert item.shipping == "Free shipping over 50 \u20ac"
    assert item.description and len(item.description.split()) == 40
    assert 1 <= len(item.reviews) <= 5 and item.reviews[0]["author"] == "user0"
    assert item.url == f"http://shop.test/product/{n}.html"


def test_other_pages_are_not_products():
    assert parse_product(response("/page/1.html", SHOP.page_html(1))) is None


def test_summary_item_of_a_page():
    item = page_summary(response("/page/4.html", SHOP.page_html(4)))
    assert item.title == "Page 4" and item.description == "Demo page number 4"
    assert item.language == "en" and item.status == 200 and item.links == 8
    assert item.final_url == item.url == "http://shop.test/page/4.html"
    assert item.text_length > 1000


@pytest.mark.parametrize("n", [4, 50])
def test_links_of_a_page_are_its_summary_links(n):
    site = DemoSite(pages=100, page_bytes=8000, seed=3)
    site.base_url = "http://shop.test"  # page 50 then links off-site and elsewhere too
    page = response(f"/page/{n}.html", site.page_html(n))
    links = hrefs(page)
    assert sorted(links) == sorted(page.css("a::attr(href)").getall())
    assert len(links) == page_summary(page).links == (8 if n % 50 else 13)


@deferred_f_from_coro_f
async def test_products_crawl(site, tmp_path, data_dir):
    urls = [f"{site.base_url}/product/{n}.html" for n in (1, 2)] + [f"{site.base_url}/page/1.html"]
    out = tmp_path / "products.jsonl"
    feed = {str(out): {"format": "jsonl"}}  # -o products.jsonl
    await crawl(
        ProductsSpider, data_dir, {"FEEDS": feed}, urls=str(write_urls(tmp_path / "u.txt", urls))
    )
    items = read_jsonl(out)
    assert sorted(i["sku"] for i in items) == ["SKU-000001", "SKU-000002"]
    assert all(i["price"] == site.product(int(i["sku"][4:]))["price"] for i in items)


@deferred_f_from_coro_f
async def test_product_table_exports_each_column_with_its_type(site, tmp_path, data_dir):
    # Only every third product has an old price: without declared types the column
    # took no type from its first values, and Parquet got it as text.
    numbers = [1, 2, 4, 5, 3, 6]
    urls = [f"{site.base_url}/product/{n}.html" for n in numbers]
    await crawl(ProductsSpider, data_dir, {}, urls=str(write_urls(tmp_path / "u.txt", urls)))
    out = tmp_path / "product.parquet"
    result = launcher.run(
        [sys.executable, "-m", "scrapy", "catalog", "export", "--table", "product"]
        + ["--format", "parquet", "-o", str(out), "-s", f"DATA_DIR={data_dir}"],
        cwd=ROOT, env=crawl_env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "exported as text" not in result.stderr, result.stderr[-3000:]
    table = pq.read_table(out)
    types = {name: str(table.schema.field(name).type) for name in table.column_names}
    assert types["old_price"] == types["price"] == types["rating"] == "double", types
    assert types["review_count"] == "int64" and types["sku"] == "string", types
    got = {row["sku"]: row["old_price"] for row in table.to_pylist()}
    assert got == {f"SKU-{n:06d}": site.product(n)["old_price"] for n in numbers}, (
        "every stored value, NULL where a product has no old price"
    )
