"""The crawl's storage, as Scrapy components reach it: the extension and its parts.

``extensions.storage.StorageExtension`` is the component (``EXTENSIONS``); its parts,
one module each, are built by it and reached through it (see ``extension.py``).
"""

from extensions.storage.extension import StorageExtension
from extensions.storage.requests import (
    CACHED_FLAG,
    CachedRequest,
    catalog_key,
    looked_up,
    unstored,
)

__all__ = [
    "CACHED_FLAG",
    "CachedRequest",
    "StorageExtension",
    "catalog_key",
    "looked_up",
    "unstored",
]
