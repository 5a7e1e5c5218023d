"""The node's metadata store: compact rows that give back exactly what went in."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest

from gateway.metadata.loop_writes import CHECKPOINT_EVERY, LoopWriter
from gateway.metadata.store import MetadataStore
from gateway.origins.base import ListEntry, ObjectInfo

SCOPE = ("origin", "bucket")
T0 = datetime(2026, 11, 25, 1, 2, 3, 456789, tzinfo=UTC)


def info(key: str, **fields: object) -> ObjectInfo:
    base: dict = dict(size=4096, etag='"' + "0f" * 16 + '"', last_modified=T0)
    return ObjectInfo(key, **{**base, **fields})


ANSWERS = [
    info("plain"),
    info("typed", content_type="image/jpeg", storage_class="GLACIER"),
    info(
        "headed",
        headers={"x-amz-checksum-crc32": "AAAAAQ==", "Content-Encoding": "gzip"},
        metadata={"owner": "team"},
        version_id="v1",
        etag='"abc-2"',
    ),
    info("naive", last_modified=datetime(2026, 1, 1, 12, 0)),
    info("elsewhere", last_modified=datetime(2026, 1, 1, tzinfo=timezone(timedelta(hours=2)))),
    info("ünï/日", size=0),
    info("upper", etag='"' + "0F" * 16 + '"'),  # not stored as bytes: it would come back lower
    info("unquoted", etag="0f" * 16),
]


async def test_rows_come_back_as_they_went_in_after_a_restart(tmp_path: Path) -> None:
    store = MetadataStore(tmp_path / "metadata.sqlite3")
    await store.start()
    for answer in ANSWERS:
        store.save(SCOPE, answer.key, answer, learned=7)
    await store.close()
    store = MetadataStore(tmp_path / "metadata.sqlite3")
    await store.start()
    try:
        for answer in ANSWERS:
            stored = await store.load(SCOPE, answer.key)
            assert stored is not None and (stored.info, stored.learned) == (answer, 7)
        assert await store.load(("origin", "other"), "plain") is None
        assert await store.load(SCOPE, "absent") is None
    finally:
        await store.close()


async def test_drops_confirmations_and_the_row_bound(tmp_path: Path) -> None:
    store = MetadataStore(tmp_path / "metadata.sqlite3", max_rows=3)
    await store.start()
    try:
        for key in ("d/a", "d/b", "e/c"):
            store.save(SCOPE, key, info(key), learned=1)
        await store.flush()
        await store.drop(SCOPE, "d/a", exact=True)
        assert await store.load(SCOPE, "d/a") is None and await store.load(SCOPE, "d/b")
        await store.drop(SCOPE, "d/")
        assert await store.load(SCOPE, "d/b") is None and await store.load(SCOPE, "e/c")

        # A listing "from the future" makes a confirmed row younger than now.
        store.confirm(SCOPE, [ListEntry("e/c", 4096, '"other"', T0)], listed_at=2e9)
        await store.flush()
        assert (await store.load(SCOPE, "e/c")).age >= 0  # type: ignore[union-attr]
        store.confirm(SCOPE, [ListEntry("e/c", 4096, info("e/c").etag, T0)], listed_at=2e9)
        await store.flush()
        assert (await store.load(SCOPE, "e/c")).age < 0  # type: ignore[union-attr]

        for i in range(5):
            store.save(SCOPE, f"f/{i}", info(f"f/{i}"), learned=1)
        await store.flush()
        kept = [k for k in ("e/c", *(f"f/{i}" for i in range(5))) if await store.load(SCOPE, k)]
        assert len(kept) == 3
    finally:
        await store.close()


async def test_an_older_layout_is_started_over(tmp_path: Path) -> None:
    db = sqlite3.connect(tmp_path / "metadata.sqlite3")
    db.execute("CREATE TABLE objects (origin TEXT, bucket TEXT, key TEXT, info TEXT, "
               "stored_at REAL, learned INTEGER, etag TEXT, size INTEGER)")  # fmt: skip
    db.execute("INSERT INTO objects VALUES ('origin', 'bucket', 'k', '{}', 0, 0, '\"e\"', 1)")
    db.commit()
    db.close()
    store = MetadataStore(tmp_path / "metadata.sqlite3")
    await store.start()
    try:
        assert await store.load(SCOPE, "k") is None
        store.save(SCOPE, "k", info("k"), learned=1)
        await store.flush()
        assert (await store.load(SCOPE, "k")).info == info("k")  # type: ignore[union-attr]
    finally:
        await store.close()


async def test_the_row_bound_drops_the_oldest_rows_when_writes_could_pass_it(
    tmp_path: Path,
) -> None:
    store = MetadataStore(tmp_path / "metadata.sqlite3", max_rows=4)
    await store.start()
    try:
        for key in ("old/a", "old/b"):
            store.save(SCOPE, key, info(key), learned=1)
        await store.flush()
        new = ("new/a", "new/b", "new/c", "new/d")
        for key in new:
            store.save(SCOPE, key, info(key), learned=1)
        await store.flush()  # six rows: the two older ones go
        assert [await store.load(SCOPE, key) for key in ("old/a", "old/b")] == [None, None]
        assert all([await store.load(SCOPE, key) for key in new])
        store.save(SCOPE, "new/a", info("new/a"), learned=2)  # a replaced row adds none
        await store.flush()
        assert all([await store.load(SCOPE, key) for key in new])
    finally:
        await store.close()


async def test_concurrent_flushes_share_writes_and_each_row_is_on_disk_when_its_flush_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cold object's row must be readable by a sibling worker once its flush returns
    (the sibling reads the store after the fetch lock opens); flushes asked while a
    write runs share the next one, so 20 concurrent flushes take fewer than 20 writes."""
    path = tmp_path / "metadata.sqlite3"
    store = MetadataStore(path, shared=True, flush_interval=3600)
    await store.start()
    sibling = sqlite3.connect(path)
    keys = [f"k{i}" for i in range(20)]
    writes = []
    write = store._write
    monkeypatch.setattr(store, "_write", lambda *batch: writes.append(1) or write(*batch))

    async def fetched(key: str) -> None:
        await asyncio.sleep(0)  # the tasks' saves interleave with the writes
        store.save(SCOPE, key, info(key), learned=1)
        await store.flush()
        found = sibling.execute("SELECT count(*) FROM objects WHERE key=?", (key,)).fetchone()
        assert found == (1,), key

    try:
        await asyncio.gather(*(fetched(key) for key in keys))
        assert sibling.execute("SELECT count(*) FROM objects").fetchone() == (20,)
        assert 1 <= len(writes) < len(keys)
    finally:
        sibling.close()
        await store.close()


async def test_a_row_written_with_a_text_etag_reads_back_the_same(tmp_path: Path) -> None:
    """Rows from before MD5 ETags were stored as 16 bytes keep their meaning."""
    path = tmp_path / "metadata.sqlite3"
    store = MetadataStore(path)
    await store.start()
    store.save(SCOPE, "plain", info("plain"), learned=3)
    await store.close()
    db = sqlite3.connect(path)  # as an older Hoard wrote it
    db.execute("UPDATE objects SET etag = ?", (info("plain").etag,))
    db.commit()
    db.close()
    store = MetadataStore(path)
    await store.start()
    try:
        stored = await store.load(SCOPE, "plain")
        assert stored is not None and stored.info == info("plain")
    finally:
        await store.close()


async def test_a_point_read_on_the_loop_sees_a_siblings_flush_and_falls_back_when_it_cannot_read(
    tmp_path: Path,
) -> None:
    """``load`` reads on the loop, through its own connection: a row a sibling worker's
    store shared is seen by the next read (each read is a fresh snapshot), and a
    read that fails there (here: a connection to a database without the table) is
    asked again of the store's thread."""
    path = tmp_path / "metadata.sqlite3"
    mine, sibling = MetadataStore(path, shared=True), MetadataStore(path, shared=True)
    await mine.start()
    await sibling.start()
    try:
        assert await mine.load(SCOPE, "plain") is None
        sibling.save(SCOPE, "plain", ANSWERS[0], learned=3)
        await sibling.share(SCOPE, "plain")  # as its fetch under the key's lock does
        stored = await mine.load(SCOPE, "plain")
        assert stored is not None and (stored.info, stored.learned) == (ANSWERS[0], 3)
        reader = mine._reader
        mine._reader = sqlite3.connect(tmp_path / "empty.sqlite3", timeout=0)
        try:
            with pytest.raises(sqlite3.OperationalError):
                mine._reader.execute("SELECT info FROM objects")
            stored = await mine.load(SCOPE, "plain")
            assert stored is not None and stored.info == ANSWERS[0]
        finally:
            mine._reader.close()
            mine._reader = reader
    finally:
        await sibling.close()
        await mine.close()


async def test_one_worker_answers_a_second_read_of_an_absent_key_without_sqlite(
    tmp_path: Path,
) -> None:
    """Without sibling workers only this store's ``save`` adds rows: a key a read found
    absent is answered absent once more without asking SQLite (a cold GET reads it on the
    hit path, then under the fetch lock), and a save of it is seen by the next read, from
    the database too once flushed."""
    store = MetadataStore(tmp_path / "metadata.sqlite3", flush_interval=3600)
    await store.start()
    selects = _selects_of(store)
    try:
        assert await store.load(SCOPE, "plain") is None
        assert await store.load(SCOPE, "plain") is None
        assert len(selects) == 1
        assert await store.load(SCOPE, "plain") is None  # each remembered miss answers one read
        assert len(selects) == 2
        store.save(SCOPE, "plain", ANSWERS[0], learned=5)
        await store.flush()
        stored = await store.load(SCOPE, "plain")
        assert stored is not None and (stored.info, stored.learned) == (ANSWERS[0], 5)
        assert len(selects) == 3  # read from the database: the save forgot the miss
    finally:
        await store.close()


async def test_share_writes_a_row_for_siblings_on_the_loop_and_through_the_thread_when_busy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With sibling workers a cold object's row is committed before its fetch lock opens.
    ``share`` commits it on the loop (no trip to the store's thread); while a sibling holds
    the write lock it waits for it on the store's thread instead, as ``flush`` does. Either
    way a sibling's connection reads the row once ``share`` returns."""
    path = tmp_path / "metadata.sqlite3"
    store = MetadataStore(path, shared=True, flush_interval=3600)
    await store.start()
    sibling = sqlite3.connect(path, isolation_level=None)
    thread_writes: list[int] = []
    asked = threading.Event()
    write = store._write

    def counted(*batch: object) -> None:
        thread_writes.append(1)
        asked.set()
        write(*batch)  # type: ignore[arg-type]

    monkeypatch.setattr(store, "_write", counted)

    def rows(key: str) -> tuple[int]:
        return sibling.execute("SELECT count(*) FROM objects WHERE key=?", (key,)).fetchone()

    try:
        store.save(SCOPE, "free", info("free"), learned=1)
        await store.share(SCOPE, "k")
        assert rows("free") == (1,) and thread_writes == []
        sibling.execute("BEGIN IMMEDIATE")  # a sibling worker is writing
        store.save(SCOPE, "busy", info("busy"), learned=1)
        sharing = asyncio.ensure_future(store.share(SCOPE, "k"))
        assert await asyncio.to_thread(asked.wait, 30)  # the thread waits for the lock
        assert not sharing.done()
        sibling.execute("COMMIT")
        await sharing
        assert rows("busy") == (1,) and thread_writes == [1]
    finally:
        sibling.close()
        await store.close()


async def test_rows_shared_on_the_loop_keep_the_log_bounded(tmp_path: Path) -> None:
    """The loop's connection never checkpoints (that syncs files); the store's thread
    does, every ``CHECKPOINT_EVERY`` commits, so the write-ahead log is cut back to its
    limit instead of holding every row written (~12 KiB a commit here)."""
    path = tmp_path / "metadata.sqlite3"
    store = MetadataStore(path, shared=True, flush_interval=3600)
    await store.start()
    wal = path.with_name(path.name + "-wal")
    try:
        for i in range(8 * CHECKPOINT_EVERY):
            store.save(SCOPE, f"k{i}", info(f"k{i}"), learned=1)
            await store.share(SCOPE, "k")
            writer = store._loop_writer
            assert writer is not None
            if writer.maintaining is not None:  # each checkpoint done before the next commit
                await writer.maintaining
        assert wal.stat().st_size <= 1 << 20
        stored = await store.load(SCOPE, f"k{8 * CHECKPOINT_EVERY - 1}")
        assert stored is not None
    finally:
        await store.close()


async def test_a_second_read_of_an_absent_key_asks_sqlite_only_if_a_sibling_wrote_it_since(
    tmp_path: Path,
) -> None:
    """With sibling workers, a cold GET reads the store on the hit path and again under the
    key's fetch lock. A sibling that fetched the key meanwhile shared its row and bumped the
    lock's version: then the second read asks SQLite and finds the row; else it is answered
    absent without SQLite."""
    path = tmp_path / "metadata.sqlite3"
    mine, sibling = MetadataStore(path, shared=True), MetadataStore(path, shared=True)
    await mine.start()
    await sibling.start()
    selects = _selects_of(mine)
    try:
        assert await mine.load(SCOPE, "plain") is None
        async with mine.fetch_lock(SCOPE, "plain"):
            assert await mine.load(SCOPE, "plain") is None
        assert len(selects) == 1
        assert await mine.load(SCOPE, "plain") is None  # the hit path's read, next GET
        async with sibling.fetch_lock(SCOPE, "plain"):  # the sibling fetches it first
            sibling.save(SCOPE, "plain", ANSWERS[0], learned=7)
            await sibling.share(SCOPE, "plain")
        async with mine.fetch_lock(SCOPE, "plain"):
            stored = await mine.load(SCOPE, "plain")
        assert stored is not None and (stored.info, stored.learned) == (ANSWERS[0], 7)
        assert len(selects) == 3
    finally:
        await sibling.close()
        await mine.close()


def test_a_loop_write_that_fails_leaves_no_transaction_holding_the_write_lock(
    tmp_path: Path,
) -> None:
    """A failed write on the loop (here a constraint the row breaks) says so, and ends its
    transaction: left open, it would hold the database's write lock for good."""
    path = tmp_path / "t.sqlite3"
    other = sqlite3.connect(path, timeout=0, isolation_level=None)
    other.execute("PRAGMA journal_mode = WAL")
    other.execute("CREATE TABLE t (n INTEGER NOT NULL)")
    writer = LoopWriter(path, "INSERT INTO t VALUES (?)", 1 << 20)
    try:
        assert writer.write([(1,)])
        assert not writer.write([(2,), (None,)])
        other.execute("BEGIN IMMEDIATE")  # the write lock is free
        other.execute("COMMIT")
        assert other.execute("SELECT n FROM t").fetchall() == [(1,)]
        assert (writer.written, writer.commits) == (1, 1)
    finally:
        writer.close()
        other.close()


def _selects_of(store: MetadataStore) -> list[str]:
    """The SELECTs the store's point reader runs from now on, as SQLite traces them."""
    selects: list[str] = []
    assert store._reader is not None
    store._reader.set_trace_callback(
        lambda sql: selects.append(sql) if sql.startswith("SELECT") else None
    )
    return selects


async def test_the_fetches_that_end_in_one_turn_share_one_commit_on_the_loop(
    tmp_path: Path,
) -> None:
    """Cold objects whose fetches end together make their rows visible to siblings in one
    loop transaction, at the end of the turn; a fetch ending later commits on its own."""
    path = tmp_path / "metadata.sqlite3"
    store = MetadataStore(path, shared=True, flush_interval=3600)
    await store.start()
    sibling = sqlite3.connect(path, isolation_level=None)

    async def fetched(key: str) -> None:
        store.save(SCOPE, key, info(key), learned=1)
        await store.share(SCOPE, key)

    try:
        await asyncio.gather(*(fetched(f"k{i}") for i in range(5)))
        writer = store._loop_writer
        assert writer is not None
        assert (writer.written, writer.commits) == (5, 1)
        assert sibling.execute("SELECT count(*) FROM objects").fetchone() == (5,)
        await fetched("later")
        assert (writer.written, writer.commits) == (6, 2)
    finally:
        sibling.close()
        await store.close()
