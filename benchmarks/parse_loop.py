"""The parser's own speed: every stored page parsed in one plain loop, nothing else.

    python -m benchmarks.parse_loop DATA_DIR [--processes N]

Reads every response record of DATA_DIR's archive files in file order with FastWARC,
builds an ``HtmlResponse`` and calls the ``products`` spider's ``parse_product`` on
it, keeping the items in a list: the floor of ``scrapy reparse products``, which
``benchmarks.bench_reparse_loop`` runs beside it. Prints the number of items.

With ``--processes N``, N forked processes each run the same loop over one of N
consecutive shares of the records (cut at record offsets the catalog gives, each
share read with one read as a re-parse worker reads its tasks): the floor of a
re-parse on N cores.
"""

from __future__ import annotations

import argparse
import io
import multiprocessing
import sqlite3
from pathlib import Path

from fastwarc.warc import ArchiveIterator, WarcRecordType
from scrapy.http import HtmlResponse

from crawler.helptext import ToolHelpFormatter
from spiders.products import parse_product


def parse_stream(stream, items: list) -> None:
    for record in ArchiveIterator(stream, record_types=WarcRecordType.response):
        http = record.http_headers
        response = HtmlResponse(
            url=record.headers["WARC-Target-URI"],
            status=http.status_code,
            headers=list(http.items()),
            body=record.reader.read(),
        )
        items.append(parse_product(response))


def parse_all(data_dir: Path) -> list:
    items: list = []
    for path in sorted((data_dir / "archive").glob("*.warc.gz")):
        with open(path, "rb") as f:
            parse_stream(f, items)
    return items


def shares(data_dir: Path, processes: int) -> list[list[tuple[Path, int, int]]]:
    """The records cut into ``processes`` consecutive shares of about as many records:
    each a list of (file, start, end) byte ranges that begin at a record."""
    with sqlite3.connect(f"file:{data_dir / 'metadata.db'}?mode=ro", uri=True) as conn:
        rows = conn.execute('SELECT archive, "offset" FROM artifacts ORDER BY archive, "offset"')
        rows = rows.fetchall()
    size = -(-len(rows) // processes)
    out = []
    for first in range(0, len(rows), size):
        chunk = rows[first : first + size]
        following = rows[first + size] if first + size < len(rows) else None
        ranges = []
        for archive in dict.fromkeys(a for a, _ in chunk):
            path = data_dir / archive
            start = min(o for a, o in chunk if a == archive)
            end = following[1] if following and following[0] == archive else path.stat().st_size
            ranges.append((path, start, end))
        out.append(ranges)
    return out


def parse_share(ranges: list[tuple[Path, int, int]]) -> int:
    items: list = []
    for path, start, end in ranges:
        with open(path, "rb") as f:
            f.seek(start)
            parse_stream(io.BytesIO(f.read(end - start)), items)
    return len(items)


def parse_on(data_dir: Path, processes: int) -> int:
    """The number of items parsed by ``processes`` forked processes."""
    parts = shares(data_dir, processes)
    with multiprocessing.get_context("fork").Pool(processes) as pool:
        return sum(pool.map(parse_share, parts, chunksize=1))


def main() -> None:
    parser = argparse.ArgumentParser(
        formatter_class=ToolHelpFormatter, description=__doc__.splitlines()[0]
    )
    parser.add_argument("data_dir", type=Path)
    parser.add_argument("--processes", type=int, default=1)
    args = parser.parse_args()
    if args.processes > 1:
        print(parse_on(args.data_dir, args.processes))
    else:
        print(len(parse_all(args.data_dir)))


if __name__ == "__main__":
    main()
