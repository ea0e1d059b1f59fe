"""Scrapy's FilesPipeline with its downloads kept in the archive, never as loose files.

With ``FILES_STORE = "archive://"``, :class:`ArchiveFilesPipeline` is Scrapy's
``FilesPipeline`` whose store (:class:`ArchiveFilesStore`) writes nothing: a download
passes through the storage middleware like any response, so its body is an archived
record with its catalog row already. The item's ``files`` field says ``url``, ``path``,
``checksum`` (MD5 of the body) and ``status`` as Scrapy documents; ``path`` is the
download's catalog key and extension (``<key>.pdf``), which ``scrapy catalog`` tools and
``DataDir.read`` resolve. Whether a file is downloaded already is the catalog's answer
(:class:`ArchiveMedia`, shared with ``pipelines/archive_images.py``): a stored key is
``uptodate`` until ``FILES_EXPIRES`` days after its fetch; then it is revalidated
(fetched again, or refreshed by a 304). A download that failed without a row (a
dropped connection, a 5xx after retries) leaves its item's page to be parsed again by
the next crawl, which tries it again (``middlewares/items.py``).
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import PurePosixPath
from typing import Any

from scrapy.pipelines.files import FilesPipeline
from scrapy.utils.misc import arg_to_iter
from twisted.internet.threads import deferToThread

from crawler.storage.catalog import Catalog
from crawler.storage.datadir import DataDir
from extensions.storage import StorageExtension, catalog_key
from middlewares.items import ItemPagesMiddleware

logger = logging.getLogger(__name__)
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
        # The keys of the records made from a download (an image's thumbnails): a
        # download is complete once they are stored too.
        self.made_keys: Callable[[str], list[str]] = lambda key: []

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
            made = self.made_keys(key)
            missing = bool(made) and len(catalog.present(made)) < len(made)
        if row is None or row.status != 200 or missing:
            # Not downloaded, an error page, or its thumbnails not stored: requested,
            # and answered from the archive when stored (ArchiveMedia).
            return {}
        body = self.datadir.read(row).body
        fetched = datetime.fromisoformat(row.fetched_at.replace("Z", "+00:00")).timestamp()
        return {"last_modified": fetched, "checksum": hashlib.md5(body).hexdigest()}  # noqa: S324


class ArchiveMedia:
    """What FilesPipeline and ImagesPipeline share with the ``archive://`` store: the
    storage extension, paths named by catalog keys, and the catalog's answer to
    "downloaded already?"."""

    STORE_SCHEMES = {**FilesPipeline.STORE_SCHEMES, SCHEME: ArchiveFilesStore}

    @classmethod
    def from_crawler(cls, crawler):
        pipeline = super().from_crawler(crawler)
        pipeline.storage = None
        if pipeline.archived:
            pipeline.storage = StorageExtension.of(crawler)
            if pipeline.storage is None:
                raise ValueError(
                    f"{cls.__name__}: the archive:// store keeps downloads in the archive, "
                    "which needs the storage extension (ARCHIVE_ENABLED is off)"
                )
            pipeline.store.datadir = DataDir.from_settings(crawler.settings)
        return pipeline

    @property
    def archived(self) -> bool:
        return isinstance(self.store, ArchiveFilesStore)

    def file_path(self, request, response=None, info=None, *, item=None) -> str:
        # FilesPipeline's name: its extension is the URL's (ImagesPipeline's is .jpg).
        default = FilesPipeline.file_path(self, request, response, info, item=item)
        if not self.archived:
            return super().file_path(request, response, info, item=item)
        return catalog_key(request) + PurePosixPath(default).suffix

    def media_to_download(self, request, info, *, item=None):
        if not self.archived:
            return super().media_to_download(request, info, item=item)
        path = self.file_path(request, info=info, item=item)
        dfd = self.store.stat_file(path, info)
        dfd.addCallback(self._stored, request, path)
        dfd.addErrback(self._stat_failed, request)
        return dfd

    def _stored(self, stat: dict, request, path: str) -> dict | None:
        meta = request.meta
        # What is requested is answered from the archive when it is stored (a replay:
        # its thumbnails are made again), never skipped as stored.
        meta["catalog_replay"] = True
        fetched = stat.get("last_modified")
        if not fetched:
            return None
        if (time.time() - fetched) / 86400 > self.expires:
            meta["catalog_revalidate"] = True  # expired: fetched again, or a 304
            return None
        self.inc_stats("uptodate")
        return {
            "url": request.url,
            "path": path,
            "checksum": stat["checksum"],
            "status": "uptodate",
        }

    def item_completed(self, results, item, info):
        if self.archived and not all(ok for ok, _ in results):
            self._note_failures(results, item, info)
        return super().item_completed(results, item, info)

    def _note_failures(self, results, item, info) -> None:
        """A download that failed without a row (not a final answer such as a 404,
        which is stored) leaves the item's page to be parsed again by the next crawl."""
        # The results come in the order of the item's media requests.
        requests = arg_to_iter(self.get_media_requests(item, info))
        failed = [r for r, (ok, _) in zip(requests, results, strict=False) if not ok]
        storage = self.storage
        lost = [
            r
            for r in failed
            if not storage.waits.in_flight(key := catalog_key(r))
            and storage.stored.lookup(key) is None
        ]
        if not lost:
            return
        try:
            pages = self.crawler.get_spider_middleware(ItemPagesMiddleware)
        except RuntimeError:
            pages = None
        if pages is not None:
            pages.download_failed(item)

    def _stat_failed(self, failure, request) -> None:
        logger.error(
            "%s: cannot look %s up in the catalog: %s; downloading it",
            type(self).__name__,
            request.url,
            failure.getErrorMessage(),
        )
        request.meta["catalog_replay"] = True
        return None


class ArchiveFilesPipeline(ArchiveMedia, FilesPipeline):
    """``FilesPipeline`` that knows the ``archive://`` store and names files by key."""
