"""Helpers for the project's spiders: URL lists and shards (``urls``), who fetches a
URL (``partition``), registered domains (``domains``), page parsers (``parsers``)."""
