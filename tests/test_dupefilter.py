"""The duplicate filter that moves its fingerprints to a temporary SQLite file."""

from __future__ import annotations

import subprocess
import sys

import pytest
from scrapy import Request
from scrapy.utils.request import RequestFingerprinter

from extensions.dupefilter import SpillingDupeFilter
from tests.conftest import ROOT


def make(limit: int, **kw) -> SpillingDupeFilter:
    return SpillingDupeFilter(fingerprinter=RequestFingerprinter(), memory_fingerprints=limit, **kw)


def test_fingerprints_moved_to_disk_are_still_recognised():
    dupes = make(10)
    urls = [f"http://example.org/p{n}?b=2&a=1" for n in range(1000)]
    assert not any(dupes.request_seen(Request(u)) for u in urls)
    assert dupes.in_memory < 10
    assert dupes.spilled >= 990
    # Same canonical URL (query order), same method: a duplicate, wherever it is kept.
    assert all(dupes.request_seen(Request(f"http://example.org/p{n}?a=1&b=2")) for n in range(1000))
    assert not dupes.request_seen(Request(urls[0], method="POST"))
    dupes.close("finished")


def test_a_job_directory_keeps_scrapys_file_and_loads_it_back(tmp_path):
    first = SpillingDupeFilter(
        str(tmp_path), fingerprinter=RequestFingerprinter(), memory_fingerprints=5
    )
    for n in range(20):
        first.request_seen(Request(f"http://example.org/{n}"))
    first.close("shutdown")
    again = SpillingDupeFilter(
        str(tmp_path), fingerprinter=RequestFingerprinter(), memory_fingerprints=5
    )
    assert again.spilled == 20  # more than fit in memory: moved at once
    assert all(again.request_seen(Request(f"http://example.org/{n}")) for n in range(20))
    assert not again.request_seen(Request("http://example.org/new"))
    again.close("finished")


def test_a_zero_threshold_is_refused():
    with pytest.raises(ValueError, match="DUPEFILTER_MEMORY_FINGERPRINTS must be at least 1"):
        make(0)


def test_a_full_temporary_disk_is_a_clear_error(tmp_path):
    # RLIMIT_FSIZE makes any file write beyond 256 KiB fail as a full disk would.
    script = f"""
import resource, signal, sys
sys.path.insert(0, {str(ROOT)!r})
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (256 * 1024, 256 * 1024))
from scrapy import Request
from scrapy.utils.request import RequestFingerprinter
from extensions.dupefilter import SpillingDupeFilter
dupes = SpillingDupeFilter(fingerprinter=RequestFingerprinter(), memory_fingerprints=1000, cache_mib=1)
for n in range(200_000):
    dupes.request_seen(Request(f"http://example.org/{{n}}"))
"""
    env = {"SQLITE_TMPDIR": str(tmp_path), "PATH": "/usr/bin:/bin"}
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120
    )
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("extensions.dupefilter.DupeFilterError: duplicate filter: cannot")
    assert f"temporary database in {tmp_path}" in last
    assert "SQLITE_TMPDIR" in last
