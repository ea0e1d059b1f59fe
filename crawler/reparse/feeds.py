"""Write items to a file whose format follows its extension, complete or absent.

jsonl/jl, json, csv and xml go through Scrapy's feed exporters; parquet through
pyarrow, in row groups of ``PARQUET_BATCH`` items. The file is written under a
temporary name beside the target and renamed when :meth:`ItemFileWriter.close`
succeeds; :meth:`ItemFileWriter.abort` removes it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from itemadapter import ItemAdapter

# Scrapy's exporters by name, imported only by a run that writes one of these formats:
# the item tables and parquet have no use for them.
EXPORTERS = {
    ".jsonl": "JsonLinesItemExporter",
    ".jl": "JsonLinesItemExporter",
    ".json": "JsonItemExporter",
    ".csv": "CsvItemExporter",
    ".xml": "XmlItemExporter",
}
FORMATS = sorted([*EXPORTERS, ".parquet"])
PARQUET_BATCH = 10_000


class _NoPandas:
    """A meta path finder that has ``import pandas`` fail (see :func:`load_arrow`)."""

    def find_spec(self, name, path=None, target=None):
        if name == "pandas":
            raise ModuleNotFoundError("pandas is not used to write parquet here", name=name)
        return None


def load_arrow() -> None:
    """Import pyarrow, and have it take the values it converts for plain Python values.

    The first time pyarrow converts Python values it imports pandas to ask whether
    they are pandas objects, which took longer than importing pyarrow itself. Items
    reach the parquet writer as plain values (:func:`crawler.reparse.runner.plain`):
    that import is made to fail once, and pyarrow does not ask again. A process that
    has imported pandas already keeps it, and pyarrow still imports it when asked for
    pandas itself (``to_pandas``).
    """
    import pyarrow as pa
    import pyarrow.parquet  # noqa: F401

    if "pandas" in sys.modules:
        return
    finder = _NoPandas()
    sys.meta_path.insert(0, finder)
    try:
        pa.array([])
    finally:
        sys.meta_path.remove(finder)


def takes_dicts(path: str | os.PathLike) -> bool:
    """Whether items written to ``path`` may come as plain dicts
    (:meth:`ItemFileWriter.write_dict`): parquet reads values, not the field metadata
    Scrapy's exporters serialize with."""
    return Path(path).suffix.lower() == ".parquet"


class FeedFormatError(ValueError):
    """The output file's extension names no known format."""


def check_output(path: str | os.PathLike) -> Path:
    path = Path(path)
    if path.suffix.lower() not in FORMATS:
        raise FeedFormatError(
            f"{path}: unknown output format {path.suffix or '(no extension)'!r}; "
            f"name the file with one of {', '.join(FORMATS)}"
        )
    return path


class ItemFileWriter:
    def __init__(self, path: str | os.PathLike, encoding: str = "utf-8"):
        self.path = check_output(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = self.path.with_name(f".{self.path.name}.tmp-{os.getpid()}")
        self.suffix = self.path.suffix.lower()
        self.count = 0
        self._file = open(self.tmp, "wb")
        self._exporter = None
        self._batch: list[dict] = []
        self._parquet = None
        if self.suffix != ".parquet":
            from scrapy import exporters

            exporter = getattr(exporters, EXPORTERS[self.suffix])
            self._exporter = exporter(self._file, encoding=encoding)
            self._exporter.start_exporting()

    def write(self, item) -> None:
        if self._exporter is not None:
            self.count += 1
            self._exporter.export_item(item)
            return
        self.write_dict(ItemAdapter(item).asdict())

    def write_dict(self, row: dict) -> None:
        """Write an item given as a dict of plain values (for paths :func:`takes_dicts` accepts)."""
        if not self.count:
            # pyarrow (and numpy, which it imports) take a few tenths of a second to
            # import: with the first item, while a pool's workers go on parsing, not at
            # close, after they are done, when nothing else runs beside it.
            load_arrow()
        self.count += 1
        self._batch.append(row)
        if len(self._batch) >= PARQUET_BATCH:
            self._write_parquet()

    def _write_parquet(self) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        if not self._batch:
            return
        if self._parquet is None:
            table = pa.Table.from_pylist(self._batch)
            self._parquet = pq.ParquetWriter(self._file, table.schema)
        else:
            table = pa.Table.from_pylist(self._batch, schema=self._parquet.schema.to_arrow_schema())
        self._parquet.write_table(table)
        self._batch.clear()

    def close(self) -> Path:
        """Finish the file and give it its name."""
        if self._exporter is not None:
            self._exporter.finish_exporting()
        else:
            self._write_parquet()
            if self._parquet is not None:
                self._parquet.close()
            else:
                import pyarrow as pa
                import pyarrow.parquet as pq

                pq.write_table(pa.table({}), self._file)
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        os.replace(self.tmp, self.path)
        return self.path

    def abort(self) -> None:
        self._file.close()
        self.tmp.unlink(missing_ok=True)
