"""What re-parse workers hand over to the process that writes."""

from __future__ import annotations

from dataclasses import dataclass, field

import scrapy
from itemadapter import ItemAdapter

from crawler.reparse.runner import plain


class Part(scrapy.Item):
    name = scrapy.Field()
    tags = scrapy.Field()


@dataclass
class Offer:
    price: float
    parts: list = field(default_factory=list)
    extra: dict = field(default_factory=dict)


def test_plain_gives_what_itemadapter_asdict_gives():
    offer = Offer(
        price=1.5,
        parts=[Part(name="a", tags=("x", "y")), {"nested": Part(name="b", tags={"z"})}],
        extra={"part": Part(name="c", tags=[1, None, b"raw"]), "n": 3, "ok": True},
    )
    assert plain(offer) == ItemAdapter(offer).asdict()
    got = plain(offer)
    assert type(got["parts"][0]) is dict and type(got["parts"][0]["tags"]) is tuple
    assert type(got["extra"]["part"]) is dict
