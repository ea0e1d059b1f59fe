from __future__ import annotations

import gzip

import pytest
from warcio.archiveiterator import ArchiveIterator

from crawler.storage.actionlog import read as read_log
from crawler.storage.catalog import Catalog
from crawler.storage.datadir import DataDir
from crawler.storage.errors import ArchiveError, TruncatedRecordError
from crawler.storage.formats.base import iter_members
from crawler.storage.formats.warc import FORMAT as WARC
from crawler.storage.formats.warc import WarcWriter
from crawler.storage.records import payload_headers
from crawler.storage.store import Store, StoreConfig, recover
from tests.factories import BODY, fetch


def test_payload_headers_describe_the_stored_body():
    fixed = payload_headers(
        [("Transfer-Encoding", "chunked"), ("Content-Length", "3"), ("A", "b")], 42
    )
    assert fixed == [
        ("X-Archive-Orig-Transfer-Encoding", "chunked"),
        ("X-Archive-Orig-Content-Length", "3"),
        ("A", "b"),
        ("Content-Length", "42"),
    ]
    assert payload_headers([("Content-Length", "42")], 42) == [("Content-Length", "42")]


def test_write_then_read_round_trip(tmp_path):
    writer = WarcWriter(tmp_path / "archive", tmp_path, prefix="t")
    row = writer.write_fetch(fetch())
    writer.flush()
    assert (tmp_path / (row.archive + ".writing")).exists()  # still being written
    stored = WARC.read(DataDir(tmp_path).resolve(row.archive), row.offset, row.length)
    assert stored.body == BODY
    assert stored.status == 200
    assert stored.url == "http://example.org/k1/final"
    assert row.fetched_at == "2023-11-14T22:13:20.250000Z"
    assert row.bytes == len(BODY) and row.etag == '"abc"'
    writer.close()
    path = tmp_path / row.archive
    assert path.exists()
    # each record is its own gzip member: warcinfo, response, request
    with open(path, "rb") as f:
        members = list(iter_members(f))
    assert len(members) == 3
    assert members[1][0] == row.offset and members[1][1] == row.length
    with open(path, "rb") as f:
        types = [(r.rec_type, r.rec_headers.get_header("WARC-Type")) for r in ArchiveIterator(f)]
    assert [t for t, _ in types] == ["warcinfo", "response", "request"]
    # the index rebuilt from the file equals the row written
    assert WARC.index(path, tmp_path).rows == [row]


def test_rollover_renames_closed_files(tmp_path):
    writer = WarcWriter(tmp_path / "archive", tmp_path, rollover_bytes=1)
    first = writer.write_fetch(fetch("a"))
    assert writer.needs_rollover()
    writer.close()
    second = writer.write_fetch(fetch("b"))
    writer.close()
    assert first.archive != second.archive
    assert len(writer.closed_files) == 2
    assert not list((tmp_path / "archive").glob("*.writing"))


def test_a_truncated_tail_is_cut_kept_aside_and_the_rest_indexed(tmp_path):
    config = StoreConfig(data_dir=tmp_path, batch_size=1000, flush_seconds=3600)
    store = Store(config)
    rows = [store.put(fetch(f"k{i}", body=BODY * (i + 1))) for i in range(5)]
    store.archive.flush()  # on disk, but no row committed
    open_path = store.archive.path
    good = open_path.stat().st_size
    with open(open_path, "ab") as f:
        f.write(gzip.compress(b"WARC/1.1\r\nWARC-Type: response\r\n")[:25])  # a torn record
    torn = open_path.read_bytes()[good:]
    # A crash: the file is left open and the batch is never committed.
    store.abandon()
    result = recover(config.datadir)
    assert len(result.repairs) == 1
    repair = result.repairs[0]
    assert repair.cut_bytes == 25 and repair.cut_file.read_bytes() == torn
    closed = tmp_path / rows[0].archive
    assert closed.stat().st_size == good
    assert result.indexed_rows == 5
    with Catalog(config.datadir.catalog_path, readonly=True) as catalog:
        assert {r.key for r in catalog.rows()} == {f"k{i}" for i in range(5)}
        for r in rows:
            assert catalog.get(r.key) == r
            assert WARC.read(closed, r.offset, r.length).body == BODY * (int(r.key[1:]) + 1)


def test_truncated_and_corrupt_records_are_reported_with_their_offset(tmp_path):
    writer = WarcWriter(tmp_path / "archive", tmp_path)
    row = writer.write_fetch(fetch())
    writer.close()
    path = tmp_path / row.archive
    data = path.read_bytes()
    truncated = tmp_path / "truncated.warc.gz"
    truncated.write_bytes(data[: row.offset + row.length // 2])
    with pytest.raises(TruncatedRecordError, match=f"offset {row.offset}"):
        WARC.read(truncated, row.offset, row.length)
    with (
        open(truncated, "rb") as f,
        pytest.raises(TruncatedRecordError, match=f"offset {row.offset}"),
    ):
        list(iter_members(f))
    corrupt = bytearray(data)
    corrupt[row.offset + 20 : row.offset + 40] = b"\x00" * 20
    bad = tmp_path / "corrupt.warc.gz"
    bad.write_bytes(bytes(corrupt))
    with pytest.raises(ArchiveError, match=f"offset {row.offset}"):
        WARC.read(bad, row.offset, row.length)


def test_a_gzip_member_cut_short_is_an_error_never_a_short_body(tmp_path):
    # FastWARC's stream reader ends a cut member's body where the bytes end, silently:
    # a re-parse reads each member whole, from the catalog's length, and inflates it
    # with its CRC and length checked.
    writer = WarcWriter(tmp_path / "archive", tmp_path)
    row = writer.write_fetch(fetch(body=BODY * 50))
    writer.close()
    path = tmp_path / row.archive
    member = path.read_bytes()[row.offset : row.offset + row.length]
    for cut in (len(member) - 8, len(member) // 2):  # its trailer; half of its deflate
        with pytest.raises(TruncatedRecordError, match=f"^{path}: offset {row.offset}: "):
            WARC.decode(member[:cut], path, row.offset)
    assert WARC.decode(member, path, row.offset).body == BODY * 50


def test_revisit_records_refresh_on_rebuild(tmp_path):
    writer = WarcWriter(tmp_path / "archive", tmp_path)
    row = writer.write_fetch(fetch(ts=1_700_000_000))
    not_modified = fetch(status=304, body=b"", ts=1_700_000_100)
    not_modified.response_headers = [("ETag", '"new"')]
    writer.write_revisit(not_modified, row.fetched_at)
    writer.close()
    indexed = WARC.index(tmp_path / row.archive, tmp_path)
    assert indexed.rows == [row]
    assert indexed.touches == [("k1", '"new"', None, "2023-11-14T22:15:00.000000Z")]
    with open(tmp_path / row.archive, "rb") as f:
        revisit = [r for r in ArchiveIterator(f) if r.rec_type == "revisit"][0]
        assert "server-not-modified" in revisit.rec_headers.get_header("WARC-Profile")


def test_repair_of_a_file_with_nothing_complete(tmp_path):
    (tmp_path / "archive").mkdir()
    open_path = tmp_path / "archive" / "x.warc.gz.open"
    open_path.write_bytes(b"\x1f\x8b\x08")
    repair = WARC.repair(open_path, tmp_path)
    assert repair.records == 0 and repair.cut_bytes == 3
    assert (tmp_path / "archive" / "x.warc.gz").stat().st_size == 0
    assert repair.cut_file.read_bytes() == b"\x1f\x8b\x08"


def test_an_ok_line_is_written_only_once_its_row_is_committed(tmp_path):
    store = Store(StoreConfig(data_dir=tmp_path, batch_size=3, flush_seconds=3600))
    datadir = DataDir(tmp_path)

    def put(n: int) -> None:
        store.put(
            fetch(f"k{n}"), {"url": f"http://example.org/{n}", "key": f"k{n}", "outcome": "ok"}
        )

    def logged() -> list[str]:
        path = datadir.action_log_path
        return [e["key"] for e in read_log(path)] if path.exists() else []

    put(0)
    put(1)
    assert logged() == []  # written to the archive, not yet committed
    put(2)  # the batch commits
    with Catalog(datadir.catalog_path, readonly=True) as catalog:
        assert catalog.count() == 3
    assert logged() == ["k0", "k1", "k2"]
    put(3)
    store.abandon()  # killed before the commit: the row is recovered, never logged as ok
    assert recover(datadir).indexed_rows == 1
    assert logged() == ["k0", "k1", "k2"]
