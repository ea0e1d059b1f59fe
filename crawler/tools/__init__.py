"""Catalog tools, one module per job (``scrapy catalog ...``, commands/catalog.py).

``stats``, ``verify``, ``rebuild`` (and merge), ``export``, ``wacz`` (and the CDXJ
index), over what ``scan`` shares. Each is a plain class or function over a data
directory; the command only parses arguments and prints.
"""
