"""Compact metadata: columnar listing snapshots and packed HEAD records give back
exactly what was put in, and page exactly like the plain listing they replace."""

from __future__ import annotations

import itertools
import random
from datetime import UTC, datetime, timedelta, timezone

import pytest

from gateway.metadata.heads import Entry, HeadTable
from gateway.metadata.snapshot import SnapshotBuilder, pack_etag, snapshot
from gateway.origins.base import ListEntry, ObjectInfo
from gateway.origins.listing import paginate

T0 = datetime(2026, 11, 24, 12, 0, 0, 123456, tzinfo=UTC)
OWNER = ("id-1", "name-1")


def entries(rng: random.Random, prefix: str, n: int) -> list[ListEntry]:
    """Keys under ``prefix`` in a few directories, some non-ASCII, with every kind of ETag."""
    names = {
        f"{prefix}{rng.choice(['a/', 'b/', 'b/c/', 'é/', ''])}{rng.choice(['x', 'y', 'ü', '日'])}{i}"
        for i in range(n)
    }
    etags = [f'"{rng.getrandbits(128):032x}"', '"abc-3"', '"ABCDEF0123456789ABCDEF0123456789"']
    return [
        ListEntry(
            key,
            rng.randrange(10**10),
            rng.choice(etags),
            T0 + timedelta(microseconds=rng.randrange(10**12)),
            rng.choice(["STANDARD", "GLACIER"]),
            rng.choice([(), ("CRC32",)]),
            rng.choice([None, OWNER]),
        )
        for key in sorted(names)
    ]


def test_a_snapshot_holds_exactly_its_entries() -> None:
    listed = entries(random.Random(1), "p/", 500)
    snap = snapshot("p/", listed)
    assert list(snap) == listed and snap[:] == listed and snap[10:20] == listed[10:20]
    assert [snap[i] for i in (0, -1, 250)] == [listed[0], listed[-1], listed[250]]
    assert list(snap.keys) == [e.key for e in listed]
    assert snap.find(listed[123].key) == listed[123] and snap.find("p/zzz") is None
    with pytest.raises(IndexError):
        snap[len(listed)]


def test_a_snapshot_pages_like_the_list_it_holds() -> None:
    rng = random.Random(2)
    listed = entries(rng, "", 400)
    snap = snapshot("", listed)
    markers = ["", "a/", "b/", "b/c/x3", "é", "zz", *(e.key for e in rng.sample(listed, 5))]
    for prefix, delimiter, after, max_keys in itertools.product(
        ["", "a/", "b/", "b", "é/", "q"], ["", "/", "c/"], markers, [1, 7, 1000]
    ):
        assert paginate(snap, prefix, delimiter, after, max_keys) == paginate(
            listed, prefix, delimiter, after, max_keys
        ), (prefix, delimiter, after, max_keys)


def test_a_snapshot_weighs_its_columns_and_is_far_smaller_than_entries() -> None:
    builder = SnapshotBuilder("train/")
    builder.add(ListEntry(f"train/{i:08d}.JPEG", 4096, f'"{i:032x}"', T0) for i in range(1000))
    assert 13_000 * 4 < builder.nbytes < 1000 * (13 + 44) + 1000  # 13 key bytes + 44 fixed
    assert builder.build().nbytes == builder.nbytes


def test_only_lowercase_md5_shaped_etags_pack() -> None:
    assert pack_etag('"' + "ab" * 16 + '"') == bytes([0xAB] * 16)
    for odd in ('"' + "AB" * 16 + '"', '"abc-2"', "ab" * 17, '"' + "zz" * 16 + '"', ""):
        assert pack_etag(odd) is None


def info(key: str, **fields: object) -> ObjectInfo:
    base: dict = dict(size=4096, etag='"' + "0f" * 16 + '"', last_modified=T0)
    return ObjectInfo(key, **{**base, **fields})


@pytest.mark.parametrize(
    "answer",
    [
        info("k"),
        info("k", content_type="image/jpeg", storage_class="GLACIER"),
        info("k", etag='"abc-2"'),  # multipart: kept unpacked
        info("k", metadata={"a": "b"}, headers={"Cache-Control": "no"}),
        info("k", version_id="v1"),
        info("k", last_modified=datetime(2026, 1, 1, tzinfo=timezone(timedelta(hours=2)))),
        None,  # negative
    ],
)
def test_a_head_comes_back_as_it_went_in(answer: ObjectInfo | None) -> None:
    table = HeadTable(1 << 20)
    table.put("scope", "k", Entry(answer, 100.5, 0, 40.25))
    got = table.get("scope", "k")
    assert got is not None and (got.value, got.fresh_until, got.learned) == (answer, 100.5, 40.25)
    assert table.empty == (answer is None) and table.peek("other", "k") is None


def test_packed_heads_are_several_times_smaller_than_kept_ones() -> None:
    packed, kept = HeadTable(1 << 30), HeadTable(1 << 30)
    for i in range(100):
        packed.put("s", f"k{i}", Entry(info(f"k{i}"), 1.0))
        kept.put("s", f"k{i}", Entry(info(f"k{i}", version_id="v"), 1.0))
    assert 3 * packed.weight < kept.weight


def test_heads_are_evicted_least_recently_used_first_by_bytes() -> None:
    one = HeadTable(1 << 20)
    one.put("s", "k0", Entry(info("k0"), 1.0))
    table = HeadTable(3 * one.weight + 5)
    for key in ("k1", "k2", "k3"):
        table.put("s", key, Entry(info(key), 1.0))
    table.get("s", "k1")
    assert table.put("s", "k4", Entry(info("k4"), 1.0)) == 1
    assert [key for _, key in table.held()] == ["k3", "k1", "k4"]
    table.drop_where(lambda scope, key: key == "k1")
    assert [key for _, key in table.held()] == ["k3", "k4"] and table.weight == 2 * one.weight
