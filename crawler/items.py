"""Items the project's spiders yield (plain dataclasses: any exporter reads them).

Each field declares its column's SQLite type (``sqlite_type``, crawler/itemrows.py), so
that a column whose first values are None (a product's ``old_price``) still gets its
type, and a Parquet export of the table its numbers.
"""

from __future__ import annotations

from dataclasses import dataclass, field


def typed(sqlite_type: str, **kwargs):
    """A dataclass field whose table column is declared *sqlite_type*."""
    return field(metadata={"sqlite_type": sqlite_type}, **kwargs)


def text(**kwargs):
    return typed("TEXT", **kwargs)


def real(**kwargs):
    return typed("REAL", **kwargs)


def integer(**kwargs):
    return typed("INTEGER", **kwargs)


def json_list():
    """A list, stored as JSON text."""
    return typed("TEXT", default_factory=list)


@dataclass
class PageSummary:
    """One HTML page, as the ``site`` spider's default callback sees it."""

    url: str = text()
    final_url: str = text()
    status: int = integer()
    title: str | None = text()
    description: str | None = text()
    language: str | None = text()
    links: int = integer()
    text_length: int = integer()


@dataclass
class Product:
    """A product page, as the ``products`` example spider parses it."""

    url: str = text()
    sku: str | None = text()
    name: str | None = text()
    brand: str | None = text()
    price: float | None = real()
    currency: str | None = text()
    availability: str | None = text()
    rating: float | None = real()
    review_count: int | None = integer()
    category: list[str] = json_list()
    description: str | None = text(default=None)
    images: list[str] = json_list()
    specs: dict[str, str] = typed("TEXT", default_factory=dict)
    colors: list[str] = json_list()
    sizes: list[str] = json_list()
    seller: str | None = text(default=None)
    shipping: str | None = text(default=None)
    old_price: float | None = real(default=None)
    related: list[str] = json_list()
    reviews: list[dict] = json_list()
