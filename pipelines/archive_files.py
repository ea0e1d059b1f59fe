"""Scrapy's FilesPipeline with its downloads kept in the archive, never as loose files.

With ``FILES_STORE = "archive://"``, :class:`ArchiveFilesPipeline` is Scrapy's
``FilesPipeline`` whose store (:class:`ArchiveFilesStore`) writes nothing: a download
passes through the storage middleware like any response, so its body is an archived
record with its catalog row already. The item's ``files`` field says ``url``, ``path``,
``checksum`` (MD5 of the body) and ``status`` as Scrapy documents; ``path`` is the
download's catalog key and extension (``<key>.pdf``), which ``scrapy catalog`` tools and
``DataDir.read`` resolve. Whether a file is downloaded already is the catalog's answer:
a stored key is ``uptodate`` until ``FILES_EXPIRES`` days after its fetch.
"""

from __future__ import annotations

import hashlib
from datetime import datetime
from pathlib import PurePosixPath
from typing import Any

from scrapy.pipelines.files import FilesPipeline
from twisted.internet.threads import deferToThread

from crawler.storage.catalog import Catalog
from crawler.storage.datadir import DataDir
from extensions.storage import catalog_key

SCHEME = "archive"


def key_of(path: str) -> str:
    """The catalog key a files-field ``path`` names (``<key><ext>``)."""
    name = PurePosixPath(path).name
    return name.split(".", 1)[0]


class ArchiveFilesStore:
    """A FILES_STORE that answers from the catalog and keeps no file of its own."""

    def __init__(self, uri: str):
        self.uri = uri
        self.datadir: DataDir | None = None  # set by the pipeline from DATA_DIR

    def persist_file(self, path: str, buf, info, meta=None, headers=None) -> None:
        # The response is archived and cataloged by the storage middleware already.
        return None

    def stat_file(self, path: str, info):
        # A catalog lookup and a body read: off the reactor thread.
        return deferToThread(self._stat, key_of(path))

    def _stat(self, key: str) -> dict[str, Any]:
        catalog_path = self.datadir.catalog_path
        if not catalog_path.exists():
            return {}
        with Catalog(catalog_path, readonly=True) as catalog:
            row = catalog.get(key)
        if row is None:
            return {}
        body = self.datadir.read(row).body
        fetched = datetime.fromisoformat(row.fetched_at.replace("Z", "+00:00")).timestamp()
        return {"last_modified": fetched, "checksum": hashlib.md5(body).hexdigest()}  # noqa: S324


class ArchiveFilesPipeline(FilesPipeline):
    """``FilesPipeline`` that knows the ``archive://`` store and names files by key."""

    STORE_SCHEMES = {**FilesPipeline.STORE_SCHEMES, SCHEME: ArchiveFilesStore}

    @classmethod
    def from_crawler(cls, crawler):
        pipeline = super().from_crawler(crawler)
        if isinstance(pipeline.store, ArchiveFilesStore):
            pipeline.store.datadir = DataDir.from_settings(crawler.settings)
        return pipeline

    def file_path(self, request, response=None, info=None, *, item=None) -> str:
        default = super().file_path(request, response, info, item=item)
        if not isinstance(self.store, ArchiveFilesStore):
            return default
        return catalog_key(request) + PurePosixPath(default).suffix
