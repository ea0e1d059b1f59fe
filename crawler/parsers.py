"""Parsers shared by the project's spiders (plain functions of a response)."""

from __future__ import annotations

from scrapy.http import HtmlResponse

from crawler.items import PageSummary


def listed_url(response) -> str:
    """The URL as listed (before redirects): the catalog's ``url`` column."""
    request = response.request
    if request is None:
        return response.url
    return request.meta.get("catalog_url", request.url)


def page_summary(response: HtmlResponse) -> PageSummary:
    """The summary item of an HTML page (the ``site`` spider's default output)."""
    title = response.css("title::text").get()
    text = " ".join(
        t.strip() for t in response.xpath("//body//text()[not(ancestor::script)]").getall()
    )
    return PageSummary(
        url=listed_url(response),
        final_url=response.url,
        status=response.status,
        title=title.strip() if title else None,
        description=response.xpath("//meta[@name='description']/@content").get(),
        language=response.xpath("/html/@lang").get(),
        links=len(response.css("a[href]")),
        text_length=len(" ".join(text.split())),
    )
