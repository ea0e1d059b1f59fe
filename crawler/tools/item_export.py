"""Item tables: list them with their row counts, export one as Parquet, CSV or JSON lines.

Every stored value is exported. Parquet columns take their types from the table's
declared SQLite types (INTEGER -> int64, REAL -> float64, TEXT -> string, BLOB ->
binary), and ``_parsed_at`` is a UTC timestamp (microseconds); columns without a
declared type are strings. A column whose stored values do not all fit its type
(SQLite keeps what it is given: text in an INTEGER column, say) is exported as text,
with a warning naming it. Lists and dicts stay JSON text.

As text (CSV, JSON lines, a Parquet column exported as text), a BLOB is hexadecimal
and a REAL is Python's shortest repr; JSON lines write an infinity as 1e999 (valid
JSON, read back as infinity). A NaN never reaches a table: it is stored as NULL.
"""

from __future__ import annotations

import csv
import logging
import os
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path

from crawler.storage.items import item_table_names, quote
from crawler.storage.itemvalues import json_text
from crawler.tools.scan import ToolError, open_catalog
from crawler.tools.tmpfiles import temp_path

TABLE_FORMATS = ("parquet", "csv", "jsonl")
BATCH = 50_000
AS_TEXT = "AS TEXT"  # the declared type of a Parquet column exported as text
# The SQLite storage classes (typeof) each declared type's Parquet column holds.
FITS = {"INTEGER": {"integer"}, "REAL": {"real", "integer"}, "BLOB": {"blob"}}

logger = logging.getLogger(__name__)


def _fitting_types(conn, table: str, cols: list[str], decls: list[str], warn) -> list[str]:
    """``decls``, but AS_TEXT for a column holding values its Parquet type cannot."""
    found = ", ".join(f"group_concat(DISTINCT typeof({quote(c)}))" for c in cols)
    classes = conn.execute(f"SELECT {found} FROM {quote(table)}").fetchone()
    out = []
    for col, decl, held in zip(cols, decls, classes, strict=True):
        held = set((held or "").split(",")) - {"null", ""}
        fits = FITS.get(decl.upper(), {"text"})
        if col == "_parsed_at" or held <= fits:
            out.append(decl)
            continue
        out.append(AS_TEXT)
        warn(
            f"table {table}, column {col} (declared {decl or 'without a type'}) holds "
            f"{', '.join(sorted(held))} values: exported as text"
        )
    return out


def text_value(value: object) -> object:
    """A stored value as CSV and a Parquet text column write it: a BLOB as hex."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return value.hex()
    return repr(value)  # int, float (shortest repr: inf, 0.1)


def item_tables(conn: sqlite3.Connection) -> list[tuple[str, int]]:
    """(name, rows) of every item table."""
    return [
        (name, conn.execute(f"SELECT count(*) FROM {quote(name)}").fetchone()[0])
        for name in item_table_names(conn)
    ]


def item_table_lines(data_dir: Path) -> list[str]:
    with open_catalog(data_dir) as catalog:
        tables = item_tables(catalog.conn)
    if not tables:
        return ["item tables: none"]
    return ["item tables:"] + [f"  {name:<30} {rows:>12,} rows" for name, rows in tables]


def _arrow_type(decl: str, name: str):
    import pyarrow as pa

    if name == "_parsed_at":
        return pa.timestamp("us", tz="UTC")
    if decl == AS_TEXT:
        return pa.string()
    return {"INTEGER": pa.int64(), "REAL": pa.float64(), "BLOB": pa.binary()}.get(
        decl.upper(), pa.string()
    )


def export_table(
    data_dir: Path, table: str, fmt: str, output: Path, warn: Callable[[str], None] | None = None
) -> int:
    """Item table ``table`` as ``fmt`` (written beside ``output``, then renamed);
    ``warn`` gets each warning (default: the log)."""
    if fmt not in TABLE_FORMATS:
        raise ToolError(f"--format {fmt!r}: use one of {', '.join(TABLE_FORMATS)}")
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(output)
    with open_catalog(data_dir) as catalog:
        conn = catalog.conn
        if table not in dict(item_tables(conn)):
            known = ", ".join(n for n, _ in item_tables(conn)) or "none"
            raise ToolError(f"--table {table!r}: no such item table (item tables: {known})")
        info = conn.execute(f"PRAGMA table_info({quote(table)})").fetchall()
        cols = [r[1] for r in info]
        decls = [r[2] for r in info]
        if fmt == "parquet":
            decls = _fitting_types(conn, table, cols, decls, warn or logger.warning)
        # Text formats: SQLite writes a BLOB's hex, no Python work per value.
        select = map(quote, cols) if fmt == "parquet" else map(_hex_blob, cols)
        cur = conn.execute(f"SELECT {', '.join(select)} FROM {quote(table)} ORDER BY _key, _seq")
        try:
            n = _WRITERS[fmt](cur, cols, decls, tmp)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
    os.replace(tmp, output)
    return n


def _hex_blob(column: str) -> str:
    """``column`` as the text formats write it: a BLOB as lowercase hex (text_value)."""
    col = quote(column)
    return f"CASE typeof({col}) WHEN 'blob' THEN lower(hex({col})) ELSE {col} END"


def _batches(cur) -> Iterator[list[tuple]]:
    while rows := cur.fetchmany(BATCH):
        yield rows


def _csv(cur, cols, decls, tmp) -> int:
    n = 0
    with open(tmp, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(cols)
        for rows in _batches(cur):
            writer.writerows(rows)
            n += len(rows)
    return n


def _jsonl(cur, cols, decls, tmp) -> int:
    n = 0
    with open(tmp, "w", encoding="utf-8") as f:
        for rows in _batches(cur):
            for row in rows:
                f.write(json_text(dict(zip(cols, row, strict=True))) + "\n")
            n += len(rows)
    return n


def _parquet(cur, cols, decls, tmp) -> int:
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    schema = pa.schema([(c, _arrow_type(d, c)) for c, d in zip(cols, decls, strict=True)])
    read = pa.schema(
        [
            (c, pa.string() if c == "_parsed_at" else t)
            for c, t in zip(cols, schema.types, strict=True)
        ]
    )
    when = cols.index("_parsed_at")
    n = 0
    with pq.ParquetWriter(tmp, schema) as writer:
        for rows in _batches(cur):
            arrays = [
                pa.array(
                    [text_value(r[i]) for r in rows]
                    if decls[i] == AS_TEXT
                    else [r[i] for r in rows],
                    type=read.field(i).type,
                )
                for i in range(len(cols))
            ]
            # ISO 8601 with or without fractions (catalogs written before microseconds).
            arrays[when] = pc.cast(arrays[when], schema.field(when).type)
            writer.write_table(pa.Table.from_arrays(arrays, schema=schema))
            n += len(rows)
        if n == 0:
            writer.write_table(schema.empty_table())
    return n


_WRITERS = {"csv": _csv, "jsonl": _jsonl, "parquet": _parquet}
