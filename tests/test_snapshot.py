"""Compact metadata: columnar listing snapshots and packed HEAD records give back
exactly what was put in, and page exactly like the plain listing they replace."""

from __future__ import annotations

import base64
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


def test_the_rows_under_a_prefix_and_their_bytes_are_those_a_scan_finds() -> None:
    listed = entries(random.Random(3), "p/", 600)
    snap = snapshot("p/", listed)
    for prefix in ["p/", "p/a/", "p/b/", "p/b/c/", "p/é/", "p/日", "p/q/", "", "o", "q"]:
        rows = snap.under(prefix)
        scanned = [i for i, e in enumerate(listed) if e.key.startswith(prefix)]
        assert list(rows) == scanned, prefix
        assert snap.size_of(rows) == sum(listed[i].size for i in scanned), prefix


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
        info(
            "k",
            headers={
                "x-amz-server-side-encryption": "AES256",
                "x-amz-checksum-crc32": "AAAAAQ==",
                "x-amz-checksum-type": "FULL_OBJECT",
                "x-amz-checksum-sha256": "not base64 é",  # kept as text, exactly
                "Content-Encoding": "gzip",
            },
            metadata={"owner": "team"},
            version_id="3HL4kqtJlcpXroDTDmJ+rmSpXd3dIbrHY",
        ),
        info("k", headers={"x-amz-checksum-crc64nvme": ""}),
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
        kept.put("s", f"k{i}", Entry(info(f"k{i}", etag='"abc-2"'), 1.0))
    assert 3 * packed.weight < kept.weight


def test_heads_with_stored_headers_pack_near_plain_ones() -> None:
    """A dataset's SSE headers and checksum type are one shape; each CRC32 is 5 bytes."""
    plain, stored = HeadTable(1 << 30), HeadTable(1 << 30)
    for i in range(100):
        crc = base64.b64encode(i.to_bytes(4, "big")).decode()
        headers = {"x-amz-server-side-encryption": "AES256", "x-amz-checksum-crc32": crc,
                   "x-amz-checksum-type": "FULL_OBJECT"}  # fmt: skip
        plain.put("s", f"k{i}", Entry(info(f"k{i}"), 1.0))
        stored.put("s", f"k{i}", Entry(info(f"k{i}", headers=headers), 1.0))
        assert stored.get("s", f"k{i}").value.headers == headers  # type: ignore[union-attr]
    assert stored.weight < plain.weight + 100 * 10 + 1000  # ~5 tail bytes each, one shape


def test_a_shape_is_forgotten_with_its_last_head() -> None:
    table = HeadTable(1 << 20)
    table.put("s", "a", Entry(info("a", metadata={"uuid": "1"}), 1.0))
    table.put("s", "b", Entry(info("b", metadata={"uuid": "2"}), 1.0))  # a shape of its own
    one_each = table.weight
    table.pop("s", "b")
    assert table.weight < one_each - 250  # b's record and its shape both gone
    table.put("s", "c", Entry(info("c", metadata={"uuid": "1"}), 1.0))  # a's shape, shared
    table.pop("s", "a")
    table.pop("s", "c")
    assert table.weight == 0 and len(table) == 0


def test_heads_are_evicted_least_recently_used_first_by_bytes() -> None:
    three = HeadTable(1 << 20)
    for key in ("k0", "k1", "k2"):
        three.put("s", key, Entry(info(key), 1.0))
    table = HeadTable(three.weight + 5)  # three heads and their one shape
    for key in ("k1", "k2", "k3"):
        table.put("s", key, Entry(info(key), 1.0))
    table.get("s", "k1")
    assert table.put("s", "k4", Entry(info("k4"), 1.0)) == 1
    assert [key for _, key in table.held()] == ["k3", "k1", "k4"]
    table.drop_where(lambda scope, key: key == "k1")
    assert [key for _, key in table.held()] == ["k3", "k4"]
    two = HeadTable(1 << 20)
    for key in ("k3", "k4"):
        two.put("s", key, Entry(info(key), 1.0))
    assert table.weight == two.weight
