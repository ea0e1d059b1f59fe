"""The ``products`` spider: a worked example of a parser for one page type.

    scrapy crawl products -a urls=product_urls.txt      # fetch and parse
    scrapy reparse products -o data/derived/products.jsonl   # parse again from the archive

Write your own the same way: a spider whose callback turns a response into items with
parsel selectors (``response.css`` / ``response.xpath``). The crawl stores every
response whatever the callback does, so the parser can be changed and run again over
the stored pages with ``scrapy reparse`` without fetching anything.
"""

from __future__ import annotations

import re

from scrapy.http import TextResponse

from crawler.items import Product
from crawler.spiderkit.parsers import listed_url
from spiders.site import SiteSpider

_NUMBER = re.compile(r"\d+(?:\.\d+)?")


def _number(text: str | None) -> float | None:
    found = _NUMBER.search(text or "")
    return float(found.group()) if found else None


def _clean(text: str | None) -> str | None:
    return " ".join(text.split()) if text else None


def parse_product(response: TextResponse) -> Product | None:
    """A :class:`Product` from a product page, or None when the page is not one."""
    product = response.css("div.product")
    if not product:
        return None
    count = _number(product.css("div.rating > span.count::text").get())
    availability = product.css("link[itemprop=availability]::attr(href)").get()
    return Product(
        url=listed_url(response),
        sku=product.attrib.get("data-sku"),
        name=_clean(product.css("h1.product-title::text").get()),
        brand=_clean(product.css("span.brand::text").get()),
        price=_number(product.css("span.price::attr(content)").get()),
        currency=product.css("meta[itemprop=priceCurrency]::attr(content)").get(),
        availability=availability.rsplit("/", 1)[-1] if availability else None,
        rating=_number(product.css("div.rating::attr(data-rating)").get()),
        review_count=int(count) if count is not None else None,
        category=response.css("nav.breadcrumb li a::text").getall(),
        description=_clean(" ".join(product.css("div.description > p::text").getall())),
        images=[
            response.urljoin(u) for u in product.css("ul.gallery > li > img::attr(src)").getall()
        ],
        specs=dict(
            zip(
                product.css("table.specs th::text").getall(),
                product.css("table.specs td::text").getall(),
                strict=False,
            )
        ),
        colors=product.css("ul.colors > li::text").getall(),
        sizes=product.css("select.sizes > option::text").getall(),
        seller=_clean(product.css("div.seller > a::text").get()),
        shipping=_clean(product.css("div.shipping::text").get()),
        old_price=_number(product.css("s.old-price::text").get()),
        related=[
            response.urljoin(u) for u in product.css("ul.related > li > a::attr(href)").getall()
        ],
        reviews=[
            {
                "author": review.css("span.author::text").get(),
                "stars": int(review.css("span.stars::text").get() or 0),
            }
            # The first five only: selecting all of them would build a Selector per review.
            for review in product.xpath(
                "(.//div[@class='reviews']/div[@class='review'])[position() <= 5]"
            )
        ],
    )


class ProductsSpider(SiteSpider):
    """Fetches a URL list like ``site`` and yields one :class:`Product` per product page."""

    name = "products"

    def parse(self, response):
        if isinstance(response, TextResponse):
            item = parse_product(response)
            if item is not None:
                yield item
        yield from self.follow_links(response)
