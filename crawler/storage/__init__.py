"""The storage core: catalog, archives, action log and the writer process.

Imports neither Scrapy nor Twisted (tests/test_storage_imports.py checks it), so the
writer process starts as a plain interpreter and every tool can use it alone.
"""
