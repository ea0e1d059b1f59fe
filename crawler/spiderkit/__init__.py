"""Helpers for the project's spiders: URL lists and shards (``urls``), registered
domains (``domains``), page parsers (``parsers``)."""
