"""The action log's lines: whole JSON objects with every field, however they are written."""

from __future__ import annotations

import json

from crawler.storage.actionlog import ActionLog, read

URLS = [
    "http://a.com/p?x=1",
    'http://a.com/"quoted"\\path',
    "http://b.org/é/ü?q=ß",
    "http://a.com/\u2028line-separator",
]


def test_cache_hits_written_in_one_go_read_as_written_one_by_one(tmp_path):
    log = ActionLog(tmp_path / "log.jsonl")
    hits = [(url, f"{n:064x}") for n, url in enumerate(URLS)]
    for url, key in hits:
        log.write(url, key, "cache_hit")
    log.write_cache_hits(hits)
    log.write_cache_hits([])
    log.close()

    lines = (tmp_path / "log.jsonl").read_text(encoding="utf-8").split("\n")[:-1]
    assert len(lines) == 2 * len(hits)
    one_by_one, batched = lines[: len(hits)], lines[len(hits) :]
    for single, batch in zip(one_by_one, batched, strict=True):
        a, b = json.loads(single), json.loads(batch)
        assert a.pop("ts")[:10] == b.pop("ts")[:10]
        assert a == b
        assert list(a) == list(b)  # same fields, same order
    entries = read(tmp_path / "log.jsonl")
    assert [(e["url"], e["key"], e["outcome"]) for e in entries[len(hits) :]] == [
        (url, key, "cache_hit") for url, key in hits
    ]
