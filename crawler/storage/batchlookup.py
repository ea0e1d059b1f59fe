"""Connections of its own to a crawl's catalogs, for the thread that looks keys up:
:class:`BatchLookup`.

A resumed list is looked up 2,000 keys a query, and followed links the keys of a turn
of the reactor a query, while the reactor keeps fetching (and the crawl's own catalog
connection serves its other readers). Python's sqlite3 connection is not to be
used by two threads at once (a statement of one was seen failing under the other's,
"returned NULL without setting an exception"), so the lookup thread reads the same
files through connections of its own.
"""

from __future__ import annotations

import sqlite3

from crawler.storage.catalog import Catalog
from crawler.storage.items import StoredParsed, parsed_keys, stored_parsed
from crawler.storage.records import Row
from crawler.storage.seen import CatalogWithSeen


class BatchLookup:
    """The stored (and parsed) keys of a batch, read through connections of its own to
    the crawl's catalog and its ``CATALOG_SEEN`` index. Made on one thread, used on one
    other at a time."""

    def __init__(self, catalog: Catalog | CatalogWithSeen):
        own = catalog.catalog if isinstance(catalog, CatalogWithSeen) else catalog
        self.catalog = Catalog(own.path, readonly=True, check_same_thread=False)
        self.seen: sqlite3.Connection | None = None
        if isinstance(catalog, CatalogWithSeen) and catalog.seen.rows:
            self.seen = sqlite3.connect(
                f"file:{catalog.seen.path}?mode=ro", uri=True, check_same_thread=False
            )

    def stored_parsed(self, keys: list[str], spider: str | None) -> StoredParsed:
        """The stored ones among ``keys``, and those of them whose items of ``spider``
        are stored (all of them with ``spider`` None: no items asked for); a key of the
        seen catalogs only is never parsed for this catalog's spider."""
        if spider is None:
            present = self.catalog.present(keys)
            found = StoredParsed(present, present)
        else:
            found = stored_parsed(self.catalog.conn, spider, keys)
        if self.seen is not None and len(found.stored) < len(keys):
            rest = [key for key in keys if key not in found.stored]
            seen = set(rest) - Catalog.absent_on(self.seen, rest, "seen")
            found.stored |= seen
            if spider is None:
                found.parsed = found.stored
        return found

    def rows(
        self, keys: list[str], spider: str | None
    ) -> tuple[dict[str, Row], set[str], set[str]]:
        """The crawl catalog's rows of ``keys``, by key; the keys among them whose items
        of ``spider`` are stored (all of them with ``spider`` None); and the keys found
        in the seen catalogs only, whose rows the caller reads itself."""
        rows: dict[str, Row] = {}
        for i in range(0, len(keys), 500):
            chunk = keys[i : i + 500]
            where = f"key IN ({','.join('?' * len(chunk))})"
            rows.update((row.key, row) for row in self.catalog.rows(where, chunk))
        parsed = set(rows) if spider is None else parsed_keys(self.catalog.conn, spider, list(rows))
        elsewhere: set[str] = set()
        if self.seen is not None and len(rows) < len(keys):
            rest = [key for key in keys if key not in rows]
            elsewhere = set(rest) - Catalog.absent_on(self.seen, rest, "seen")
        return rows, parsed, elsewhere

    def close(self) -> None:
        self.catalog.close()
        if self.seen is not None:
            self.seen.close()
