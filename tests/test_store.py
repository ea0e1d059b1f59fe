"""The writer process: what goes through its pipe is what gets stored."""

from __future__ import annotations

import hashlib
import json
import os
import random
import threading
import time

import pytest
from warcio.archiveiterator import ArchiveIterator

from crawler.storage.catalog import Catalog
from crawler.storage.datadir import DataDir
from crawler.storage.records import payload_digest
from crawler.storage.store import Store, StoreConfig
from crawler.storage.writer.client import WriterProcess
from crawler.storage.writer.wire import BodyRing, FrameReader, send_frame
from tests.factories import fetch


def test_bodies_larger_than_the_pipe_are_stored_whole_with_their_log_lines(tmp_path):
    bodies = {"big": os.urandom(3_000_000), "empty": b"", "small": b"x" * 100_000}
    writer = WriterProcess(StoreConfig(data_dir=tmp_path), queue_bytes=65_536)
    for key, body in bodies.items():
        action = {"url": f"http://example.org/{key}", "key": key, "outcome": "ok"}
        writer.put(fetch(key, body), dict(action, status=200, bytes=len(body), ts=1.5))
    summary = writer.close()
    assert summary["stored"] == 3 and summary["rows_committed"] == 3
    assert summary["cpu_seconds"] > 0

    datadir = DataDir(tmp_path)
    with Catalog(datadir.catalog_path, readonly=True) as catalog:
        for key, body in bodies.items():
            row = catalog.get(key)
            stored = datadir.read(row)
            assert stored.body == body
            assert row.payload_digest == payload_digest(body)
    lines = [json.loads(line) for line in datadir.action_log_path.read_text().splitlines()]
    assert [(x["key"], x["outcome"], x["bytes"]) for x in lines] == [
        (key, "ok", len(body)) for key, body in bodies.items()
    ]
    assert {x["ts"] for x in lines} == {"1970-01-01T00:00:01.500Z"}  # the attempt's time

    # Both digests of every record hold (warcio recomputes them while reading).
    (archive,) = datadir.archives()
    with open(archive, "rb") as f:
        records = ArchiveIterator(f, check_digests=True)
        checked = []
        for record in records:
            record.content_stream().read()
            checked.append((record.rec_type, record.digest_checker.passed))
    assert checked == [("warcinfo", True)] + [("response", True), ("request", True)] * 3


def test_a_message_cut_short_by_a_killed_crawl_is_dropped():
    read_fd, write_fd = os.pipe()
    body = os.urandom(200_000)
    sender = threading.Thread(target=send_frame, args=(write_fd, ("put", fetch("k", body), None)))
    sender.start()
    reader = FrameReader(read_fd)
    op, got, action = reader.recv()
    sender.join()
    assert (op, got.key, bytes(got.body), action) == ("put", "k", body, None)
    assert hashlib.sha1(got.body).digest() == hashlib.sha1(body).digest()

    # The crawl dies in the middle of a second message: its first bytes only arrive
    # (fewer than a pipe holds, so that this thread can write them unread).
    frame_read, frame_write = os.pipe()
    send_frame(frame_write, ("put", fetch("k2", b"y" * 20_000), None))
    os.close(frame_write)
    with os.fdopen(frame_read, "rb") as f:
        frame = f.read()
    os.write(write_fd, frame[: len(frame) // 2])
    os.close(write_fd)
    with pytest.raises(EOFError):
        reader.recv()
    os.close(read_fd)


def test_messages_read_ahead_arrive_whole_and_in_order_and_a_cut_one_is_dropped():
    read_fd, write_fd = os.pipe()
    rng = random.Random(3)
    # Small messages (many per read), bodies larger than the read-ahead (read straight
    # into place), and empty ones.
    sizes = [rng.choice([0, 10, 300, 5_000, 9_000, 70_000]) for _ in range(400)]
    sent = [("put", fetch(f"k{n}", rng.randbytes(size)), {"n": n}) for n, size in enumerate(sizes)]
    sent += [("items", ("key", "spider", [("t", ("a",), {}, (), [(n,)])], "now", False, False))
             for n in range(50)]  # fmt: skip

    def send() -> None:
        for msg in sent:
            send_frame(write_fd, msg)
        os.close(write_fd)

    sender = threading.Thread(target=send)
    sender.start()
    reader = FrameReader(read_fd, read_ahead=8192)
    got, read_ahead_seen = [], False
    while True:
        try:
            msg = reader.recv()
        except EOFError:
            break
        read_ahead_seen = read_ahead_seen or reader.buffered
        got.append(msg)
    sender.join()
    os.close(read_fd)
    assert read_ahead_seen  # some reads brought more than one message
    assert len(got) == len(sent)
    for (op, one, rest), (sent_op, two, sent_rest) in zip(got[:400], sent[:400], strict=True):
        assert (op, one.key, bytes(one.body), rest) == (sent_op, two.key, two.body, sent_rest)
    assert got[400:] == sent[400:]

    # A message cut short after whole ones: the whole ones come, then EOFError.
    read_fd, write_fd = os.pipe()
    frames_read, frames_write = os.pipe()
    for n in range(3):
        send_frame(frames_write, ("put", fetch(f"w{n}", b"x" * 100), None))
    send_frame(frames_write, ("put", fetch("cut", b"y" * 1000), None))
    os.close(frames_write)
    with os.fdopen(frames_read, "rb") as f:
        frames = f.read()
    os.write(write_fd, frames[:-500])
    os.close(write_fd)
    reader = FrameReader(read_fd, read_ahead=8192)
    assert [reader.recv()[1].key for _ in range(3)] == ["w0", "w1", "w2"]
    with pytest.raises(EOFError):
        reader.recv()
    os.close(read_fd)


def test_bodies_cross_the_shared_ring_wrapping_around_it_and_overflow_into_the_pipe(tmp_path):
    rng = random.Random(7)
    bodies = {f"k{n}": rng.randbytes(rng.randint(1, 30_000)) for n in range(300)}
    bodies["big"] = os.urandom(100_000)  # more than half the ring: through the pipe
    writer = WriterProcess(StoreConfig(data_dir=tmp_path), queue_bytes=65_536)
    for key, body in bodies.items():
        writer.put(fetch(key, body))
    summary = writer.close()
    ring_bytes = writer.ring_bytes
    assert ring_bytes > 20 * 65_536  # the ring was used and went round many times
    assert summary["stored"] == len(bodies)
    datadir = DataDir(tmp_path)
    with Catalog(datadir.catalog_path, readonly=True) as catalog:
        for key, body in bodies.items():
            assert datadir.read(catalog.get(key)).body == body


def test_the_ring_never_hands_out_space_the_writer_has_not_given_back():
    crawl = BodyRing(1000)
    writer = BodyRing(1000, fd=os.dup(crawl.fd))
    assert crawl.place(b"a" * 600) == BodyRing.INLINE  # more than half: the pipe's
    first = crawl.place(b"a" * 400)
    second = crawl.place(b"b" * 400)
    assert (first, second) == (0, 400)
    assert crawl.place(b"c" * 300) == BodyRing.INLINE  # 200 left, not contiguous
    assert writer.take(first, 400) == b"a" * 400
    assert crawl.place(b"c" * 300) == BodyRing.INLINE  # taken, not yet given back
    writer.publish()
    third = crawl.place(b"c" * 300)
    assert third == 1000  # the 200-byte tail is skipped: bodies are contiguous
    assert writer.take(second, 400) == b"b" * 400
    assert writer.take(third, 300) == b"c" * 300
    writer.publish()
    assert crawl.place(b"d" * 500) == 1300
    assert writer.take(1300, 500) == b"d" * 500
    crawl.close()
    writer.close()


def test_an_idle_writer_commits_a_short_batch_once_its_time_is_up(tmp_path):
    config = StoreConfig(data_dir=tmp_path, batch_size=1000, flush_seconds=0.2)
    writer = WriterProcess(config)
    writer.put(fetch("slow", b"one page of a slow crawl"))
    deadline = time.monotonic() + 30
    row = None
    while row is None and time.monotonic() < deadline:
        time.sleep(0.05)
        with Catalog(DataDir(tmp_path).catalog_path, readonly=True) as catalog:
            row = catalog.get("slow")
    assert row is not None  # committed with the writer still open, far short of a batch
    writer.close()


def test_a_writer_whose_crawl_died_commits_what_reached_it(tmp_path):
    config = StoreConfig(data_dir=tmp_path, batch_size=1000, flush_seconds=3600)
    writer = WriterProcess(config)
    bodies = {f"k{n}": os.urandom(5000) for n in range(5)}
    for key, body in bodies.items():
        writer.put(fetch(key, body))
    writer.abandon()  # the crawl's end of the pipes closes, unannounced
    assert not writer.alive
    datadir = DataDir(tmp_path)
    assert datadir.archives() and not datadir.open_archives()  # closed by the writer
    with Catalog(datadir.catalog_path, readonly=True) as catalog:
        assert {key: datadir.read(catalog.get(key)).body for key in bodies} == bodies


def test_a_writer_opened_on_a_directory_not_yet_made_makes_it(tmp_path):
    data_dir = tmp_path / "not" / "yet"
    writer = WriterProcess(StoreConfig(data_dir=data_dir))
    writer.put(fetch("k", b"body"))
    assert writer.close()["rows_committed"] == 1
    with Catalog(DataDir(data_dir).catalog_path, readonly=True) as catalog:
        assert DataDir(data_dir).read(catalog.get("k")).body == b"body"


def digest_queries(store: Store) -> list[str]:
    """The statements that look payloads up by digest, as the store's catalog runs them
    (filled as they run)."""
    seen: list[str] = []
    store.catalog.conn.set_trace_callback(
        lambda sql: seen.append(sql) if "payload_digest =" in sql else None
    )
    return seen


def test_fetches_stored_together_look_their_payloads_up_in_one_query(tmp_path):
    # One row per commit: the batch's second "b" comes after the commit of its first.
    config = StoreConfig(data_dir=tmp_path, dedup="digest", batch_size=1)
    store = Store(config)
    kept = store.put(fetch("old", b"stored before"))
    queries = digest_queries(store)
    store.put_many(
        [
            (fetch("a", b"stored before"), None, None),
            (fetch("b1", b"new"), None, None),
            (fetch("c", b"unseen"), None, None),
            (fetch("b2", b"new"), None, None),
        ]
    )
    assert len(queries) == 1
    store.close()
    with Catalog(config.datadir.catalog_path, readonly=True) as catalog:
        rows = {key: catalog.get(key) for key in ("old", "a", "b1", "c", "b2")}
    where = {key: (row.archive, row.offset) for key, row in rows.items()}
    assert where["a"] == where["old"] == (kept.archive, kept.offset)
    assert where["b2"] == where["b1"] and len(set(where.values())) == 3
    assert store.stored == 3 and store.revisits == 2


def test_a_writer_looking_payloads_up_by_digest_stores_each_once(tmp_path):
    config = StoreConfig(data_dir=tmp_path, dedup="digest", batch_size=5)
    writer = WriterProcess(config)
    for n in range(200):  # faster than the writer stores them: it takes several at once
        writer.put(fetch(f"k{n}", f"payload {n % 7}".encode()))
    summary = writer.close()
    assert (summary["stored"], summary["revisits"]) == (7, 193)
    datadir = DataDir(tmp_path)
    with Catalog(datadir.catalog_path, readonly=True) as catalog:
        for n in range(200):
            row = catalog.get(f"k{n}")
            assert datadir.read(row).body == f"payload {n % 7}".encode()
