"""The project package.

tldextract downloads the Public Suffix List on first use unless told where else to
look, and Scrapy's cookie middleware builds its extractor when it is imported: on the
reactor thread, with no timeout, outside the crawl's downloader. An empty URL list
makes every extractor in every process of the project use the snapshot tldextract
ships (crawler/domains.py does the same for the project's own use).
"""

import os

os.environ.setdefault("TLDEXTRACT_PUBLIC_SUFFIX_LIST_URLS", "")
