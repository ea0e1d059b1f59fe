"""Items the project's spiders yield (plain dataclasses: any exporter reads them)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class PageSummary:
    """One HTML page, as the ``site`` spider's default callback sees it."""

    url: str
    final_url: str
    status: int
    title: str | None
    description: str | None
    language: str | None
    links: int
    text_length: int


@dataclass
class Product:
    """A product page, as the ``products`` example spider parses it."""

    url: str
    sku: str | None
    name: str | None
    brand: str | None
    price: float | None
    currency: str | None
    availability: str | None
    rating: float | None
    review_count: int | None
    category: list[str] = field(default_factory=list)
    description: str | None = None
    images: list[str] = field(default_factory=list)
    specs: dict[str, str] = field(default_factory=dict)
    colors: list[str] = field(default_factory=list)
    sizes: list[str] = field(default_factory=list)
    seller: str | None = None
    shipping: str | None = None
    old_price: float | None = None
    related: list[str] = field(default_factory=list)
    reviews: list[dict] = field(default_factory=list)
