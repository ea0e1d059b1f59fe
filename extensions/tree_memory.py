"""MemoryUsage over the whole process tree: the crawl, its writer process, and (when
rendering) Playwright's driver and Chromium's processes.

Scrapy's ``MemoryUsage`` sees the crawl process only, so a browser could grow without
``MEMUSAGE_WARNING_MB`` / ``MEMUSAGE_LIMIT_MB`` noticing; scrapy-playwright's own
replacement finds no process with Playwright 1.65. This one adds the proportional set
size (PSS: shared pages split between the processes sharing them, so Chromium's many
processes are not counted many times over) of every descendant process to the crawl's
peak, so ``memusage/max`` and the limits cover the browser. ``addons/render.py`` enables it in place of ``MemoryUsage`` when rendering.
"""

from __future__ import annotations

import psutil
from scrapy.extensions.memusage import MemoryUsage


class TreeMemoryUsage(MemoryUsage):
    def get_virtual_size(self) -> int:
        size = super().get_virtual_size()
        try:
            children = psutil.Process().children(recursive=True)
        except psutil.Error:
            return size
        for child in children:
            try:
                info = child.memory_full_info()
            except psutil.AccessDenied:
                info = child.memory_info()
            except psutil.Error:  # exited meanwhile
                continue
            size += getattr(info, "pss", info.rss)
        return size
