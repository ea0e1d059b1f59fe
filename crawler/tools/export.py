"""``scrapy catalog export``: the catalog as Parquet or CSV, for pandas, DuckDB, polars."""

from __future__ import annotations

import csv
import os
from collections.abc import Iterator
from dataclasses import astuple
from pathlib import Path

from crawler.storage.catalog import COLUMNS
from crawler.storage.records import Row
from crawler.tools.scan import ToolError, open_catalog
from crawler.tools.tmpfiles import temp_path

EXPORT_FORMATS = ("parquet", "csv")


# Timestamps as timestamps, so that pandas, DuckDB and polars compare and bucket them
# without parsing; the catalog keeps the ISO 8601 text its WARC-Date equals.
# last_modified stays the server's text: a validator sent back as it came.
TIMESTAMPS = ("fetched_at",)


def _arrow_schema(timestamps: bool = True):
    import pyarrow as pa

    types = {
        "status": pa.int32(),
        "bytes": pa.int64(),
        "offset": pa.int64(),
        "length": pa.int64(),
        "rendered": pa.int8(),
    }
    if timestamps:
        types.update(dict.fromkeys(TIMESTAMPS, pa.timestamp("us", tz="UTC")))
    return pa.schema([(c, types.get(c, pa.string())) for c in COLUMNS])


def export_catalog(data_dir: Path, fmt: str, output: Path, batch: int = 50_000) -> int:
    """The catalog as a Parquet or CSV table (written beside ``output``, then renamed)."""
    if fmt not in EXPORT_FORMATS:
        raise ToolError(f"--format {fmt!r}: use one of {', '.join(EXPORT_FORMATS)}")
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(output)
    n = 0
    with open_catalog(data_dir) as catalog:
        rows = catalog.rows("1 ORDER BY key")
        if fmt == "csv":
            with open(tmp, "w", newline="", encoding="utf-8") as f:
                writer = csv.writer(f)
                writer.writerow(COLUMNS)
                for row in rows:
                    writer.writerow(astuple(row))
                    n += 1
        else:
            import pyarrow as pa
            import pyarrow.parquet as pq

            schema = _arrow_schema()
            text = _arrow_schema(timestamps=False)
            with pq.ParquetWriter(tmp, schema) as writer:
                for chunk in _chunks(rows, batch):
                    table = pa.Table.from_pylist([row.__dict__ for row in chunk], schema=text)
                    # Arrow parses ISO 8601 (the trailing Z included) in C.
                    writer.write_table(table.cast(schema))
                    n += len(chunk)
                if n == 0:
                    writer.write_table(schema.empty_table())
    os.replace(tmp, output)
    return n


def _chunks(rows: Iterator[Row], size: int) -> Iterator[list[Row]]:
    chunk: list[Row] = []
    for row in rows:
        chunk.append(row)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk
