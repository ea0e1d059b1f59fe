"""Scrapy's ImagesPipeline with its images and thumbnails kept in the archive.

With ``IMAGES_STORE = "archive://"``, :class:`ArchiveImagesPipeline` keeps each image
as the storage middleware archived it (the bytes the server sent, not Scrapy's JPEG
conversion), so the item's ``images`` field says ``url``, ``path`` (``<key><ext>``, as
for files), ``checksum`` (MD5 of the served bytes) and ``status``. Each thumbnail
(``IMAGES_THUMBS``) is a record of its own, made by the crawl rather than fetched: its
URL is ``http://thumbs.invalid/<thumb id>/<the image's key>`` and its key that URL's key
(:func:`crawler.storage.keys.thumb_key`), its body the JPEG ImagesPipeline makes, its
row in the catalog like any other. An image is downloaded already (``uptodate``, until
``IMAGES_EXPIRES`` days after its fetch) once its row and its thumbnails' rows are
stored; an image stored without them is replayed from the archive and its thumbnails
made again.
"""

from __future__ import annotations

import hashlib

from scrapy.pipelines.images import ImagesPipeline

from crawler.storage.keys import thumb_key, thumb_url
from crawler.storage.records import Fetch
from extensions.storage import catalog_key
from pipelines.archive_files import ArchiveMedia

# Response header of a thumbnail's record: the URL of its image.
THUMB_OF_HEADER = "X-Crawl-Thumbnail-Of"


class ArchiveImagesPipeline(ArchiveMedia, ImagesPipeline):
    """``ImagesPipeline`` that knows the ``archive://`` store; thumbnails are records."""

    @classmethod
    def from_crawler(cls, crawler):
        pipeline = super().from_crawler(crawler)
        if pipeline.archived:
            pipeline.store.made_keys = pipeline.thumb_keys
        return pipeline

    def thumb_keys(self, key: str) -> list[str]:
        """The keys of the thumbnails of the image stored under ``key``."""
        return [thumb_key(key, thumb_id) for thumb_id in self.thumbs]

    def thumb_path(self, request, thumb_id, response=None, info=None, *, item=None) -> str:
        if not self.archived:
            return super().thumb_path(request, thumb_id, response, info, item=item)
        return thumb_key(catalog_key(request), thumb_id) + ".jpg"

    async def image_downloaded(self, response, request, info, *, item=None) -> str:
        if not self.archived:
            return await super().image_downloaded(response, request, info, item=item)
        images = self.get_images(response, request, info, item=item)
        # The image itself is its archived response; converting it checks its size as
        # Scrapy does (ImageException) and is what the thumbnails are made from.
        next(images)
        key = catalog_key(request)
        image_url = request.meta.get("catalog_url", request.url)
        for thumb_id, (_path, _image, buf) in zip(self.thumbs, images, strict=True):
            url = thumb_url(key, thumb_id)
            self.storage.archiver.store_made(
                Fetch(
                    key=thumb_key(key, thumb_id),
                    url=url,
                    final_url=url,
                    method="GET",
                    request_headers=[],
                    request_body=b"",
                    status=200,
                    response_headers=[("Content-Type", "image/jpeg"), (THUMB_OF_HEADER, image_url)],
                    body=buf.getvalue(),
                )
            )
        return hashlib.md5(response.body).hexdigest()  # noqa: S324
