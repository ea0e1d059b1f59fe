"""The parser's own speed: every stored page parsed in one plain loop, nothing else.

    python -m benchmarks.parse_loop DATA_DIR

Reads every response record of DATA_DIR's archive files in file order with FastWARC,
builds an ``HtmlResponse`` and calls the ``products`` spider's ``parse_product`` on
it, keeping the items in a list: the floor of ``scrapy reparse products``, which
``benchmarks.bench_reparse_loop`` runs beside it. Prints the number of items.
"""

from __future__ import annotations

import sys
from pathlib import Path

from fastwarc.warc import ArchiveIterator, WarcRecordType
from scrapy.http import HtmlResponse

from spiders.products import parse_product


def parse_all(data_dir: Path) -> list:
    items = []
    for path in sorted((data_dir / "archive").glob("*.warc.gz")):
        with open(path, "rb") as f:
            for record in ArchiveIterator(f, record_types=WarcRecordType.response):
                http = record.http_headers
                response = HtmlResponse(
                    url=record.headers["WARC-Target-URI"],
                    status=http.status_code,
                    headers=list(http.items()),
                    body=record.reader.read(),
                )
                items.append(parse_product(response))
    return items


if __name__ == "__main__":
    print(len(parse_all(Path(sys.argv[1]))))
