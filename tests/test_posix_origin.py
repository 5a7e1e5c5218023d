"""PosixOrigin over a tmp_path tree: buckets, reads, safety, listings."""

from __future__ import annotations

import asyncio
import gc
import os
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gateway.core.errors import (
    InvalidObjectName,
    NoSuchBucket,
    NoSuchKey,
    OriginChanged,
    RangeNotSatisfiable,
)
from gateway.origins.base import Origin
from gateway.origins.posix import PosixOrigin, valid_bucket_name
from gateway.origins.posix_stream import CHUNK_SIZE


def write(path: Path, data: bytes = b"x") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


@pytest.fixture
def root(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    write(root / "data" / "hello.txt", b"hello world")
    write(root / "data" / "empty.bin", b"")
    write(root / "data" / "nested" / "deep" / "file.csv", b"a,b\n")
    (root / "data" / "only-dirs" / "inner").mkdir(parents=True)
    (root / "other.bucket-1").mkdir()
    (root / "Not_A_Bucket").mkdir()
    (root / "ab").mkdir()  # too short
    write(root / "stray-file", b"not a bucket")
    write(tmp_path / "outside" / "secret", b"top secret")
    return root


@pytest.fixture
def origin(root: Path) -> PosixOrigin:
    return PosixOrigin("nfs", root)


async def read_all(origin: PosixOrigin, bucket: str, key: str, **kw: object) -> bytes:
    async with await origin.get_object(bucket, key, **kw) as stream:  # type: ignore[arg-type]
        return b"".join([chunk async for chunk in stream.chunks()])


def test_is_an_origin(origin: PosixOrigin) -> None:
    assert isinstance(origin, Origin)


# -- buckets ---------------------------------------------------------------


async def test_list_buckets_lists_valid_directories_only(origin: PosixOrigin, root: Path) -> None:
    buckets = await origin.list_buckets()
    assert [b.name for b in buckets] == ["data", "other.bucket-1"]
    created = datetime.fromtimestamp((root / "data").stat().st_ctime, tz=UTC)
    assert buckets[0].created == created and buckets[0].created.tzinfo is not None


@pytest.mark.parametrize(
    ("name", "valid"),
    [
        ("data", True),
        ("a.b-c", True),
        ("a" * 63, True),
        ("ab", False),
        ("a" * 64, False),
        ("Data", False),
        ("-data", False),
        ("data-", False),
        ("a..b", False),
        ("192.168.1.1", False),
        ("da_ta", False),
        ("..", False),
        ("", False),
    ],
)
def test_bucket_name_rules(name: str, valid: bool) -> None:
    assert valid_bucket_name(name) is valid


async def test_head_bucket(origin: PosixOrigin) -> None:
    await origin.head_bucket("data")
    await origin.head_bucket("")  # the root itself
    assert await origin.bucket_region("data") == "us-east-1"
    for bad in ("missing", "Not_A_Bucket", "stray-file", "..", ".", "ab", "data/nested"):
        with pytest.raises(NoSuchBucket):
            await origin.head_bucket(bad)


async def test_symlinked_bucket_leading_out_is_not_a_bucket(
    origin: PosixOrigin, root: Path
) -> None:
    (root / "escape").symlink_to(root.parent / "outside")
    (root / "alias").symlink_to(root / "data")
    with pytest.raises(NoSuchBucket):
        await origin.head_bucket("escape")
    await origin.head_bucket("alias")
    assert [b.name for b in await origin.list_buckets()] == ["alias", "data", "other.bucket-1"]


# -- head / get -------------------------------------------------------------


async def test_head_object(origin: PosixOrigin, root: Path) -> None:
    info = await origin.head_object("data", "hello.txt")
    st = (root / "data" / "hello.txt").stat()
    assert info.key == "hello.txt" and info.size == 11
    assert info.content_type == "text/plain"
    assert info.last_modified == datetime.fromtimestamp(int(st.st_mtime), tz=UTC)
    assert info.etag.startswith('"') and info.etag.endswith('"') and len(info.etag) == 34
    assert (
        await origin.head_object("data", "empty.bin")
    ).content_type == "application/octet-stream"
    assert (await origin.head_object("", "stray-file")).content_type == "binary/octet-stream"
    assert (await origin.head_object("data", "nested/deep/file.csv")).content_type == "text/csv"


async def test_compressed_file_is_opaque_bytes(origin: PosixOrigin, root: Path) -> None:
    write(root / "data" / "t.csv.gz")
    assert (await origin.head_object("data", "t.csv.gz")).content_type == "binary/octet-stream"


async def test_directories_and_folder_keys_are_not_objects(origin: PosixOrigin) -> None:
    for key in ("nested", "nested/", "nested/deep", "only-dirs", "missing", "hello.txt/x"):
        with pytest.raises(NoSuchKey):
            await origin.head_object("data", key)
        with pytest.raises(NoSuchKey):
            await origin.get_object("data", key)


async def test_fifo_is_not_an_object(origin: PosixOrigin, root: Path) -> None:
    os.mkfifo(root / "data" / "pipe")
    with pytest.raises(NoSuchKey):
        await asyncio.wait_for(origin.get_object("data", "pipe"), 5)


async def test_get_whole_object(origin: PosixOrigin) -> None:
    async with await origin.get_object("data", "hello.txt") as stream:
        assert (stream.start, stream.end) == (0, 10)
        assert stream.info.size == 11
        assert b"".join([c async for c in stream.chunks()]) == b"hello world"


@pytest.mark.parametrize(
    ("byte_range", "expected", "span"),
    [
        ((0, 0), b"h", (0, 0)),
        ((10, 10), b"d", (10, 10)),
        ((6, 10), b"world", (6, 10)),
        ((0, 10), b"hello world", (0, 10)),
        ((6, 1000), b"world", (6, 10)),  # end clamped to size - 1
    ],
)
async def test_get_ranges(
    origin: PosixOrigin, byte_range: tuple[int, int], expected: bytes, span: tuple[int, int]
) -> None:
    async with await origin.get_object("data", "hello.txt", byte_range=byte_range) as stream:
        assert (stream.start, stream.end) == span
        assert b"".join([c async for c in stream.chunks()]) == expected


async def test_unsatisfiable_ranges(origin: PosixOrigin) -> None:
    for byte_range in ((11, 20), (5, 4), (-1, 3)):
        with pytest.raises(RangeNotSatisfiable):
            await origin.get_object("data", "hello.txt", byte_range=byte_range)


async def test_empty_object(origin: PosixOrigin) -> None:
    async with await origin.get_object("data", "empty.bin") as stream:
        assert (stream.start, stream.end) == (0, -1)
        assert [c async for c in stream.chunks()] == []


async def test_large_file_streams_in_bounded_chunks(origin: PosixOrigin, root: Path) -> None:
    data = os.urandom(CHUNK_SIZE * 3 + 12345)
    write(root / "data" / "big.bin", data)
    async with await origin.get_object("data", "big.bin") as stream:
        chunks = [c async for c in stream.chunks()]
    assert b"".join(chunks) == data
    assert len(chunks) == 4 and max(map(len, chunks)) == CHUNK_SIZE
    start, end = CHUNK_SIZE - 5, 2 * CHUNK_SIZE + 5
    async with await origin.get_object("data", "big.bin", byte_range=(start, end)) as stream:
        chunks = [c async for c in stream.chunks()]
    assert b"".join(chunks) == data[start : end + 1]
    assert all(len(c) <= CHUNK_SIZE for c in chunks)


async def test_open_stream_survives_rename_and_replace(origin: PosixOrigin, root: Path) -> None:
    path = write(root / "data" / "swap.bin", b"A" * (CHUNK_SIZE + 10))
    async with await origin.get_object("data", "swap.bin") as stream:
        chunks = stream.chunks()
        first = await anext(chunks)
        replacement = write(root / "data" / "swap.tmp", b"B" * (CHUNK_SIZE + 10))
        replacement.replace(path)
        rest = b"".join([c async for c in chunks])
    assert set(first + rest) == {ord("A")}


async def test_file_shrinking_during_read_is_origin_changed(
    origin: PosixOrigin, root: Path
) -> None:
    path = write(root / "data" / "shrink.bin", b"x" * (CHUNK_SIZE + 10))
    async with await origin.get_object("data", "shrink.bin") as stream:
        chunks = stream.chunks()
        await anext(chunks)
        os.truncate(path, 10)
        with pytest.raises(OriginChanged):
            await anext(chunks)


async def test_if_match(origin: PosixOrigin) -> None:
    etag = (await origin.head_object("data", "hello.txt")).etag
    assert await read_all(origin, "data", "hello.txt", if_match=etag) == b"hello world"
    with pytest.raises(OriginChanged):
        await origin.get_object("data", "hello.txt", if_match='"0123456789abcdef0123456789abcdef"')


async def test_etag_is_stable_and_changes_on_modification(origin: PosixOrigin, root: Path) -> None:
    path = root / "data" / "hello.txt"
    first = (await origin.head_object("data", "hello.txt")).etag
    assert (await origin.head_object("data", "hello.txt")).etag == first
    async with await origin.get_object("data", "hello.txt") as stream:
        assert stream.info.etag == first
    assert (await PosixOrigin("again", root).head_object("data", "hello.txt")).etag == first
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1))
    touched = (await origin.head_object("data", "hello.txt")).etag
    assert touched != first
    path.write_bytes(b"hello world!")
    assert (await origin.head_object("data", "hello.txt")).etag not in (first, touched)


async def test_aclose_is_idempotent_and_stops_reads(origin: PosixOrigin) -> None:
    stream = await origin.get_object("data", "hello.txt")
    await stream.aclose()
    await stream.aclose()
    with pytest.raises(ValueError):
        await anext(stream.chunks())


async def test_unicode_space_and_plus_names(origin: PosixOrigin, root: Path) -> None:
    names = ["é t+é/日本 語.txt", "a+b c", "%2e%2e/x", "sp ace/+plus+"]
    for name in names:
        write(root / "data" / "uni" / name, name.encode())
    for name in names:
        assert await read_all(origin, "data", f"uni/{name}") == name.encode()
    page = await origin.list_objects("data", prefix="uni/")
    assert [e.key for e in page.entries] == sorted(f"uni/{n}" for n in names)


# -- safety -------------------------------------------------------------------


@pytest.mark.parametrize(
    "key",
    [
        "../outside/secret",
        "../../root/../outside/secret",
        "nested/../../outside/secret",
        "a/../../x",
        "./hello.txt",
        "nested/./deep/file.csv",
        "/etc/passwd",
        "//etc/passwd",
        "nested//deep/file.csv",
        "hello.txt\0",
        "..",
        ".",
        "",
        "/",
        "bad\udcff",
    ],
)
async def test_traversal_and_malformed_keys_are_rejected(origin: PosixOrigin, key: str) -> None:
    with pytest.raises(InvalidObjectName):
        await origin.head_object("data", key)
    with pytest.raises(InvalidObjectName):
        await origin.get_object("data", key)


async def test_root_mode_cannot_escape_either(origin: PosixOrigin) -> None:
    with pytest.raises(InvalidObjectName):
        await origin.head_object("", "../outside/secret")
    assert (await origin.head_object("", "data/hello.txt")).size == 11


async def test_percent_encoded_dots_are_literal_names(origin: PosixOrigin, root: Path) -> None:
    with pytest.raises(NoSuchKey):
        await origin.head_object("data", "%2e%2e/outside/secret")
    write(root / "data" / "%2e%2e" / "x", b"literal")
    assert await read_all(origin, "data", "%2e%2e/x") == b"literal"


async def test_symlinks_pointing_outside_are_invisible(origin: PosixOrigin, root: Path) -> None:
    outside = root.parent / "outside"
    (root / "data" / "evil-file").symlink_to(outside / "secret")
    (root / "data" / "evil-dir").symlink_to(outside)
    (root / "data" / "nested" / "evil-rel").symlink_to("../../../outside/secret")
    for key in ("evil-file", "evil-dir/secret", "nested/evil-rel"):
        with pytest.raises(NoSuchKey):
            await origin.head_object("data", key)
        with pytest.raises(NoSuchKey):
            await origin.get_object("data", key)
    listed = [e.key for e in (await origin.list_objects("data")).entries]
    assert not any("evil" in key for key in listed)
    with pytest.raises(NoSuchKey):
        await origin.head_object("", "data/evil-dir/secret")


async def test_symlinks_inside_root_are_followed(origin: PosixOrigin, root: Path) -> None:
    (root / "data" / "link.txt").symlink_to("hello.txt")
    (root / "data" / "linkdir").symlink_to(root / "data" / "nested")
    assert await read_all(origin, "data", "link.txt") == b"hello world"
    assert await read_all(origin, "data", "linkdir/deep/file.csv") == b"a,b\n"
    keys = [e.key for e in (await origin.list_objects("data")).entries]
    assert "link.txt" in keys and "linkdir/deep/file.csv" in keys


async def test_symlinks_into_another_bucket_are_invisible(origin: PosixOrigin, root: Path) -> None:
    # A key is limited to its bucket: a link must not reach a sibling bucket's files.
    write(root / "other.bucket-1" / "private.txt", b"private")
    write(root / "other.bucket-1" / "sub" / "inner.txt", b"inner")
    (root / "data" / "link-other").symlink_to("../other.bucket-1/private.txt")
    (root / "data" / "dir-other").symlink_to(root / "other.bucket-1" / "sub")
    (root / "data" / "nested" / "up").symlink_to("../../other.bucket-1")
    for key in ("link-other", "dir-other/inner.txt", "nested/up/private.txt"):
        with pytest.raises(NoSuchKey):
            await origin.head_object("data", key)
        for byte_range in (None, (0, 2)):
            with pytest.raises(NoSuchKey):
                await origin.get_object("data", key, byte_range)
    for delimiter in ("", "/"):
        page = await origin.list_objects("data", delimiter=delimiter)
        listed = [e.key for e in page.entries] + page.common_prefixes
        assert not any("other" in key or "up" in key for key in listed), listed
        for prefix in ("dir-other/", "nested/up/", "link-other"):
            page = await origin.list_objects("data", prefix=prefix, delimiter=delimiter)
            assert page.entries == [] and page.common_prefixes == []
    with pytest.raises(InvalidObjectName):
        await origin.put_object("data", "dir-other/new.txt", _body(b"no"))
    # The root mount (bucket "") holds both folders: there the same links stay inside.
    assert await read_all(origin, "", "data/link-other") == b"private"
    assert await read_all(origin, "", "data/dir-other/inner.txt") == b"inner"
    # The other bucket itself still serves its own files.
    assert await read_all(origin, "other.bucket-1", "private.txt") == b"private"


async def _body(data: bytes) -> AsyncIterator[bytes]:
    yield data


async def test_symlink_loops_do_not_hang_listing(origin: PosixOrigin, root: Path) -> None:
    (root / "data" / "nested" / "loop").symlink_to(root / "data")
    (root / "data" / "self").symlink_to(".")
    (root / "other.bucket-1" / "a").mkdir()
    (root / "other.bucket-1" / "b").mkdir()
    (root / "other.bucket-1" / "a" / "to-b").symlink_to(root / "other.bucket-1" / "b")
    (root / "other.bucket-1" / "b" / "to-a").symlink_to(root / "other.bucket-1" / "a")
    write(root / "other.bucket-1" / "b" / "f")
    keys = [e.key for e in (await origin.list_objects("data")).entries]
    assert keys == ["empty.bin", "hello.txt", "nested/deep/file.csv"]
    keys = [e.key for e in (await origin.list_objects("other.bucket-1")).entries]
    assert keys == ["a/to-b/f", "b/f"]
    page = await origin.list_objects("data", delimiter="/")
    assert page.common_prefixes == ["nested/"]


async def test_bucket_dotdot_is_no_bucket(origin: PosixOrigin) -> None:
    with pytest.raises(NoSuchBucket):
        await origin.head_object("..", "outside/secret")
    with pytest.raises(NoSuchBucket):
        await origin.list_objects("..")


async def test_prefix_cannot_escape(origin: PosixOrigin) -> None:
    for prefix in ("../", "../outside/", "nested/../../", "/etc/", "nested//"):
        page = await origin.list_objects("data", prefix=prefix)
        assert page.entries == [] and page.common_prefixes == []


# -- listing ------------------------------------------------------------------


@pytest.fixture
def tree(root: Path) -> Path:
    bucket = root / "other.bucket-1"
    for rel in [
        "a.txt",
        "b/1",
        "b/2",
        "b/c/3",
        "b/d/e/4",
        "bb",
        "c0/x",
        "data-2024-01/x",
        "data-2024-02/y",
    ]:
        write(bucket / rel, rel.encode())
    (bucket / "empty" / "deeper" / "still").mkdir(parents=True)
    (bucket / "b" / "hollow").mkdir()
    return bucket


ALL_KEYS = [
    "a.txt",
    "b/1",
    "b/2",
    "b/c/3",
    "b/d/e/4",
    "bb",
    "c0/x",
    "data-2024-01/x",
    "data-2024-02/y",
]


async def test_flat_listing_has_every_file_and_no_directories(
    origin: PosixOrigin, tree: Path
) -> None:
    page = await origin.list_objects("other.bucket-1")
    assert [e.key for e in page.entries] == ALL_KEYS
    assert page.common_prefixes == [] and not page.is_truncated
    entry = page.entries[0]
    info = await origin.head_object("other.bucket-1", "a.txt")
    assert (entry.size, entry.etag, entry.last_modified) == (
        info.size,
        info.etag,
        info.last_modified,
    )


async def test_delimiter_listing_skips_empty_directories(origin: PosixOrigin, tree: Path) -> None:
    page = await origin.list_objects("other.bucket-1", delimiter="/")
    assert [e.key for e in page.entries] == ["a.txt", "bb"]
    assert page.common_prefixes == ["b/", "c0/", "data-2024-01/", "data-2024-02/"]
    page = await origin.list_objects("other.bucket-1", prefix="b/", delimiter="/")
    assert [e.key for e in page.entries] == ["b/1", "b/2"]
    assert page.common_prefixes == ["b/c/", "b/d/"]


async def test_prefix_in_the_middle_of_a_name(origin: PosixOrigin, tree: Path) -> None:
    page = await origin.list_objects("other.bucket-1", prefix="b", delimiter="/")
    assert ([e.key for e in page.entries], page.common_prefixes) == (["bb"], ["b/"])
    page = await origin.list_objects("other.bucket-1", prefix="b/d/e")
    assert [e.key for e in page.entries] == ["b/d/e/4"]
    page = await origin.list_objects("other.bucket-1", prefix="b/c/3")
    assert [e.key for e in page.entries] == ["b/c/3"]
    page = await origin.list_objects("other.bucket-1", prefix="missing/dir/")
    assert page.entries == [] and not page.is_truncated


async def test_other_delimiter(origin: PosixOrigin, tree: Path) -> None:
    page = await origin.list_objects("other.bucket-1", prefix="data-", delimiter="-")
    assert page.common_prefixes == ["data-2024-"]
    page = await origin.list_objects("other.bucket-1", delimiter="-")
    assert page.common_prefixes == ["data-"]
    page = await origin.list_objects("other.bucket-1", delimiter="/c")
    assert page.common_prefixes == ["b/c"]


@pytest.mark.parametrize("delimiter", ["", "/"])
@pytest.mark.parametrize("max_keys", [1, 2, 3, 1000])
async def test_pagination_covers_everything_once(
    origin: PosixOrigin, tree: Path, delimiter: str, max_keys: int
) -> None:
    items, marker = [], ""
    while True:
        page = await origin.list_objects(
            "other.bucket-1", delimiter=delimiter, start_after=marker, max_keys=max_keys
        )
        got = sorted([e.key for e in page.entries] + page.common_prefixes)
        assert len(got) <= max_keys and page.next_marker == (got[-1] if got else None)
        items += got
        if not page.is_truncated:
            break
        marker = page.next_marker
    expected = (
        ALL_KEYS
        if not delimiter
        else ["a.txt", "b/", "bb", "c0/", "data-2024-01/", "data-2024-02/"]
    )
    assert items == expected


async def test_start_after(origin: PosixOrigin, tree: Path) -> None:
    page = await origin.list_objects("other.bucket-1", start_after="b/c/3")
    assert [e.key for e in page.entries] == ALL_KEYS[4:]
    page = await origin.list_objects("other.bucket-1", delimiter="/", start_after="b/")
    assert ([e.key for e in page.entries], page.common_prefixes[:1]) == (["bb"], ["c0/"])
    page = await origin.list_objects("other.bucket-1", max_keys=0)
    assert page.entries == [] and not page.is_truncated and page.next_marker is None


async def test_root_mode_lists_the_whole_tree(origin: PosixOrigin, tree: Path) -> None:
    page = await origin.list_objects("", delimiter="/")
    assert page.common_prefixes == ["data/", "other.bucket-1/"]
    assert [e.key for e in page.entries] == ["stray-file"]
    page = await origin.list_objects("", prefix="other.bucket-1/b/", delimiter="/")
    assert page.common_prefixes == ["other.bucket-1/b/c/", "other.bucket-1/b/d/"]


async def test_empty_directories_never_listed(origin: PosixOrigin, root: Path) -> None:
    for delimiter in ("", "/"):
        page = await origin.list_objects("data", prefix="only-dirs", delimiter=delimiter)
        assert page.entries == [] and page.common_prefixes == []


async def test_unlistable_names_are_skipped(origin: PosixOrigin, root: Path) -> None:
    write(Path(os.fsdecode(os.fsencode(root / "data") + b"/bad-\xff-name")))
    os.mkfifo(root / "data" / "pipe")
    keys = [e.key for e in (await origin.list_objects("data")).entries]
    assert keys == ["empty.bin", "hello.txt", "nested/deep/file.csv"]


async def test_symlinked_prefix_leading_out_lists_nothing(origin: PosixOrigin, root: Path) -> None:
    (root / "data" / "evil-dir").symlink_to(root.parent / "outside")
    for delimiter in ("", "/"):
        page = await origin.list_objects("data", prefix="evil-dir/", delimiter=delimiter)
        assert page.entries == [] and page.common_prefixes == []


async def test_symlink_loop_key_is_missing(origin: PosixOrigin, root: Path) -> None:
    (root / "data" / "la").symlink_to("lb")
    (root / "data" / "lb").symlink_to("la")
    for key in ("la", "la/x"):
        with pytest.raises(NoSuchKey):
            await origin.head_object("data", key)
    assert "la" not in [e.key for e in (await origin.list_objects("data")).entries]


async def test_delimiter_listing_does_not_descend_into_rolled_directories(
    origin: PosixOrigin, root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for i in range(50):
        write(root / "data" / "wide" / f"d{i:02d}" / "x" / "y" / "file")
    calls: list[str] = []
    real_scandir = os.scandir

    def counting_scandir(path: str) -> object:
        calls.append(path)
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", counting_scandir)
    page = await origin.list_objects("data", prefix="wide/", delimiter="/", max_keys=2)
    assert page.common_prefixes == ["wide/d00/", "wide/d01/"] and page.is_truncated
    # the base, then one probe down to a file for each of the 3 prefixes needed
    assert len(calls) == 1 + 3 * 3


def _link(fd: str) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:  # closed since it was listed
        return ""


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc")
async def test_streams_release_their_descriptor(origin: PosixOrigin, root: Path) -> None:
    # Count descriptors open on this file only: gc.collect() may close unrelated
    # ones that earlier tests left to the collector.
    target = str((root / "data" / "hello.txt").resolve())

    def open_on_target() -> int:
        return sum(1 for fd in os.listdir("/proc/self/fd") if _link(fd) == target)

    stream = await origin.get_object("data", "hello.txt")
    assert open_on_target() == 1
    await stream.aclose()
    assert open_on_target() == 0
    stream = await origin.get_object("data", "hello.txt")
    del stream  # dropped without aclose(): the finalizer closes it
    await asyncio.sleep(0)  # the loop's handle that resumed us still holds to_thread's result
    gc.collect()
    assert open_on_target() == 0
    with pytest.raises(OriginChanged):
        await origin.get_object("data", "hello.txt", if_match='"nope"')
    with pytest.raises(RangeNotSatisfiable):
        await origin.get_object("data", "hello.txt", byte_range=(50, 60))
    assert open_on_target() == 0
