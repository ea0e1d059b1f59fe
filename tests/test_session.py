"""StorageSession, DataDir and the formats registry, without Scrapy."""

from __future__ import annotations

import pytest
from scrapy.settings import Settings

from crawler import settings as project
from crawler.storage import formats
from crawler.storage.datadir import DataDir
from crawler.storage.errors import StoreError
from crawler.storage.formats.base import OPEN_SUFFIX, writing_marker
from crawler.storage.session import SessionConfig, StorageSession
from crawler.storage.store import Store, StoreConfig
from tests.factories import listed_body, listed_fetch


def scrapy_settings(**values) -> Settings:
    settings = Settings()
    settings.setmodule(project, priority="project")
    settings.setdict(values, priority="cmdline")
    return settings


def test_a_session_stores_replays_and_sums_up(data_dir):
    session = StorageSession(SessionConfig.from_settings(scrapy_settings(DATA_DIR=data_dir)))
    recovery = session.open()
    assert recovery.repairs == [] and recovery.indexed_rows == 0
    session.put(listed_fetch(1), {"url": "http://example.org/page/1", "key": "k", "outcome": "ok"})
    summary = session.close()
    assert summary["stored"] == 1 and summary["rows_committed"] == 1
    text = session.summary(summary).text()
    assert text.startswith("This run stored 1 responses (")
    assert "1 rows (200: 1)" in text and "in 1 files" in text

    reader = StorageSession.reading(DataDir(data_dir))
    reader.open_readonly()
    row = reader.lookup(listed_fetch(1).key)
    assert reader.replay(row).body == listed_body(1)
    assert reader.lookup(listed_fetch(2).key) is None
    reader.close()


def test_a_second_session_on_a_data_dir_is_refused_and_the_first_recovers_a_kill(data_dir):
    config = SessionConfig(StoreConfig(data_dir))
    first = StorageSession(config)
    first.open()
    second = StorageSession(config)
    with pytest.raises(StoreError, match="is in use by another crawl"):
        second.open()
    second.close()
    first.close()

    store = Store(StoreConfig(data_dir, batch_size=1000, flush_seconds=3600))
    store.put(listed_fetch(3))
    store.archive.flush()
    store.abandon()  # a kill: the file stays open, its row uncommitted
    assert DataDir(data_dir).open_archives()
    session = StorageSession(config)
    recovery = session.open()
    assert recovery.indexed_rows == 1 and len(recovery.repairs) == 1
    assert session.replay(session.lookup(listed_fetch(3).key)).body == listed_body(3)
    session.close()


def test_a_row_whose_record_is_unreadable_is_not_stored(data_dir):
    store = Store(StoreConfig(data_dir))
    row = store.put(listed_fetch(4))
    store.close()
    datadir = DataDir(data_dir)
    datadir.resolve(row.archive).write_bytes(b"")
    session = StorageSession.reading(datadir)
    session.open_readonly()
    assert session.replay(session.lookup(row.key)) is None
    session.close()


@pytest.mark.parametrize(
    ("setting", "value", "message"),
    [
        ("CATALOG_BATCH_SIZE", 0, "CATALOG_BATCH_SIZE=0: give an integer of at least 1"),
        ("ARCHIVE_COMPRESSOR", "lz4", "ARCHIVE_COMPRESSOR='lz4': give one of isal, zlib"),
        ("ARCHIVE_GZIP_LEVEL", 4, "ARCHIVE_GZIP_LEVEL is 0-3 with ARCHIVE_COMPRESSOR=isal"),
        ("ARCHIVE_FORMAT", "tar", "ARCHIVE_FORMAT='tar': give one of warc, zip, sqlite"),
    ],
)
def test_bad_storage_settings_name_the_setting(setting, value, message):
    with pytest.raises(ValueError, match=message):
        SessionConfig.from_settings(scrapy_settings(**{setting: value}))


def test_session_settings_are_read_once_into_a_config(tmp_path):
    config = SessionConfig.from_settings(
        scrapy_settings(
            DATA_DIR=tmp_path,
            ARCHIVE_FORMAT="ZIP",
            ARCHIVE_COMPRESSOR="zlib",
            ARCHIVE_GZIP_LEVEL=9,
            CATALOG_SEEN=["a/*.db"],
        )
    )
    assert config.datadir == DataDir(tmp_path)
    assert (config.store.format, config.store.compressor, config.store.gzip_level) == (
        "zip",
        "zlib",
        9,
    )
    assert config.seen == ["a/*.db"] and 404 in config.store_statuses


# -- DataDir and the registry ---------------------------------------------------------------


def test_data_dir_layout_and_archives_of_every_format(tmp_path):
    datadir = DataDir(tmp_path)
    assert datadir.catalog_path == tmp_path / "metadata.db"
    assert datadir.action_log_path == tmp_path / "fetch_log.jsonl"
    assert datadir.lock_path == tmp_path / ".lock"
    datadir.archive_dir.mkdir()
    names = ["a.warc.gz", "b.zip", "c.warc.gz", "d.zip" + OPEN_SUFFIX, "a.warc.gz.cut-1"]
    for name in [*names, "notes.txt"]:
        (datadir.archive_dir / name).write_bytes(b"x")
    for name in ["c.warc.gz", "e.warc.gz"]:  # e: killed before its first byte
        writing_marker(datadir.archive_dir / name).touch()
    assert [p.name for p in datadir.archives()] == ["a.warc.gz", "b.zip"]
    assert [p.name for p in datadir.archives(formats.get("zip"))] == ["b.zip"]
    assert [p.name for p in datadir.open_archives()] == ["c.warc.gz", "d.zip.open"]
    assert [p.name for p in datadir.stale_markers()] == ["e.warc.gz.writing"]
    assert datadir.resolve("archive/c.warc.gz") == datadir.archive_dir / "c.warc.gz"
    # The file being written and the cut-off tail count, notes.txt does not.
    assert datadir.archive_bytes() == (5, 2)
    shipped = tmp_path / "shared" / "catalogs" / "job.db"
    assert DataDir.of_catalog(shipped) == DataDir((tmp_path / "shared").resolve())
    assert DataDir.from_settings({"DATA_DIR": ""}) == DataDir("data")


def test_the_registry_knows_each_format_by_name_and_by_file():
    assert formats.names() == "warc, zip or sqlite"
    assert formats.get(None) is formats.get("WARC") is formats.FORMATS["warc"]
    assert formats.for_path("archive/x.zip.open").name == "zip"
    assert formats.for_path("x.warc.gz").name == "warc"
    with pytest.raises(ValueError, match="not an archive file of any format"):
        formats.for_path("x.tar")
