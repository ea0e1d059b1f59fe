"""The archive formats, by name and by file: the one place that lists them.

Each format is one module holding an :class:`~crawler.storage.formats.base.ArchiveFormat`
(writer, reader, indexer, repair, the glob of its files). Everything else asks this
registry: the store for a writer, readers and tools for the format of a file. A new
format is a new module here and one line in ``FORMATS``.
"""

from __future__ import annotations

import os

from crawler.storage.errors import SettingError
from crawler.storage.formats.base import OPEN_SUFFIX, ArchiveFormat
from crawler.storage.formats.sqlite import FORMAT as SQLITE
from crawler.storage.formats.warc import FORMAT as WARC
from crawler.storage.formats.zip import FORMAT as ZIP

FORMATS: dict[str, ArchiveFormat] = {fmt.name: fmt for fmt in (WARC, ZIP, SQLITE)}
DEFAULT = WARC.name

__all__ = ["FORMATS", "OPEN_SUFFIX", "ArchiveFormat", "for_path", "get", "names"]


def names() -> str:
    """The formats' names, for messages: ``warc, zip or sqlite``."""
    *first, last = FORMATS
    return f"{', '.join(first)} or {last}" if first else last


def get(name: str | None) -> ArchiveFormat:
    """The format ``ARCHIVE_FORMAT`` names (any case; empty: the default)."""
    fmt = FORMATS.get((name or DEFAULT).lower())
    if fmt is None:
        raise SettingError(f"ARCHIVE_FORMAT must be {names()}, not {name!r}")
    return fmt


def for_path(path: str | os.PathLike) -> ArchiveFormat:
    """The format of an archive file, closed or ``.open``, from its name."""
    for fmt in FORMATS.values():
        if fmt.owns(path):
            return fmt
    raise ValueError(f"{path}: not an archive file of any format ({names()})")
