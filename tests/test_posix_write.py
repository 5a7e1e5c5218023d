"""PosixOrigin writes over a tmp_path tree: atomic puts, deletes, copies, multipart, safety."""

from __future__ import annotations

import asyncio
import errno
import hashlib
import os
import time
from collections.abc import AsyncIterator, Iterable
from pathlib import Path

import pytest

from gateway.core.errors import (
    EntityTooSmall,
    InvalidArgument,
    InvalidObjectName,
    InvalidPart,
    InvalidPartOrder,
    MetadataTooLarge,
    NoSuchBucket,
    NoSuchKey,
    NoSuchUpload,
)
from gateway.origins.posix import PosixOrigin
from gateway.origins.posix_files import TEMP_PREFIX
from gateway.origins.posix_multipart import STAGING_DIR
from gateway.origins.posix_records import META_XATTR

MIB = 1 << 20


@pytest.fixture
def root(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    (root / "data").mkdir(parents=True)
    (root / "other-bucket").mkdir()
    (tmp_path / "outside").mkdir()
    return root


@pytest.fixture
def origin(root: Path) -> PosixOrigin:
    return PosixOrigin("nfs", root)


async def body(*pieces: bytes) -> AsyncIterator[bytes]:
    for piece in pieces:
        yield piece


async def pieces_of(data: bytes, size: int) -> AsyncIterator[bytes]:
    for start in range(0, len(data), size):
        yield data[start : start + size]


class Boom(Exception):
    """What a body raises mid-stream (a client gone, a checksum that failed)."""


async def failing(*pieces: bytes) -> AsyncIterator[bytes]:
    for piece in pieces:
        yield piece
    raise Boom


async def read_all(origin: PosixOrigin, bucket: str, key: str) -> bytes:
    async with await origin.get_object(bucket, key) as stream:
        return b"".join([chunk async for chunk in stream.chunks()])


def quoted_md5(data: bytes) -> str:
    return '"' + hashlib.md5(data).hexdigest() + '"'


def files_under(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


def temp_files(path: Path) -> list[Path]:
    return [p for p in path.rglob("*") if p.name.startswith(TEMP_PREFIX)]


async def keys(origin: PosixOrigin, bucket: str, **kw: str) -> list[str]:
    page = await origin.list_objects(bucket, **kw)  # type: ignore[arg-type]
    return [e.key for e in page.entries] + page.common_prefixes


# -- put / get ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "piece"),
    [
        (b"", 1),
        (b"hello", 1),
        (os.urandom(3 * MIB + 12345), 64 * 1024),
        (os.urandom(2 * MIB), 3 * MIB),
    ],
    ids=["empty", "tiny-bytewise", "multi-mib-small-pieces", "one-big-piece"],
)
async def test_put_get_roundtrip_is_byte_exact(
    origin: PosixOrigin, root: Path, data: bytes, piece: int
) -> None:
    result = await origin.put_object("data", "dir/sub/obj.bin", pieces_of(data, piece))
    assert result.size == len(data)
    assert result.etag == quoted_md5(data)
    assert (root / "data" / "dir" / "sub" / "obj.bin").read_bytes() == data
    assert await read_all(origin, "data", "dir/sub/obj.bin") == data
    info = await origin.head_object("data", "dir/sub/obj.bin")
    assert (info.etag, info.size, info.last_modified) == (
        result.etag,
        result.size,
        result.last_modified,
    )
    assert temp_files(root) == []


async def test_metadata_roundtrip_through_head_get_and_list(origin: PosixOrigin) -> None:
    result = await origin.put_object(
        "data",
        "report.csv.gz",
        body(b"a,b\n"),
        content_type="application/x-custom",
        metadata={"Owner": "alice", "run-id": "42"},
        headers={
            "cache-control": "max-age=60",
            "Content-Disposition": 'attachment; filename="r.csv.gz"',
            "Content-Encoding": "gzip",
            "Content-Language": "en",
            "Expires": "Wed, 21 Oct 2037 07:28:00 GMT",
            "X-Not-Stored": "dropped",
        },
    )
    info = await origin.head_object("data", "report.csv.gz")
    assert info.content_type == "application/x-custom"
    assert info.metadata == {"owner": "alice", "run-id": "42"}
    assert info.headers == {
        "Cache-Control": "max-age=60",
        "Content-Disposition": 'attachment; filename="r.csv.gz"',
        "Content-Encoding": "gzip",
        "Content-Language": "en",
        "Expires": "Wed, 21 Oct 2037 07:28:00 GMT",
    }
    async with await origin.get_object("data", "report.csv.gz") as stream:
        assert stream.info == info
    page = await origin.list_objects("data")
    assert [(e.key, e.etag) for e in page.entries] == [("report.csv.gz", result.etag)]


async def test_without_content_type_it_is_guessed_and_nothing_else_is_stored(
    origin: PosixOrigin,
) -> None:
    await origin.put_object("data", "page.html", body(b"<p>"))
    info = await origin.head_object("data", "page.html")
    assert (info.content_type, info.metadata, info.headers) == ("text/html", {}, {})


async def test_overwrite_replaces_bytes_and_metadata(origin: PosixOrigin, root: Path) -> None:
    await origin.put_object("data", "k", body(b"old" * 1000), metadata={"v": "1"})
    result = await origin.put_object("data", "k", body(b"new"), content_type="text/plain")
    assert await read_all(origin, "data", "k") == b"new"
    info = await origin.head_object("data", "k")
    assert (info.etag, info.metadata, info.content_type) == (result.etag, {}, "text/plain")
    assert files_under(root / "data") == ["k"]


async def test_failed_body_leaves_old_object_and_no_temp_file(
    origin: PosixOrigin, root: Path
) -> None:
    await origin.put_object("data", "k", body(b"original"), metadata={"v": "1"})
    before = await origin.head_object("data", "k")
    with pytest.raises(Boom):
        await origin.put_object("data", "k", failing(b"x" * (3 * MIB), b"partial"))
    assert await read_all(origin, "data", "k") == b"original"
    assert await origin.head_object("data", "k") == before
    assert temp_files(root) == []
    with pytest.raises(Boom):  # a new key: nothing at all, not even its directories
        await origin.put_object("data", "new/deep/key", failing(b"x" * MIB))
    assert files_under(root / "data") == ["k"]


async def test_cancelled_put_leaves_nothing(origin: PosixOrigin, root: Path) -> None:
    started = asyncio.Event()

    async def endless() -> AsyncIterator[bytes]:
        for sent in range(1_000_000):
            yield b"y" * MIB
            if sent == 2:
                started.set()  # two chunks written: the temp file exists and holds bytes
            await asyncio.sleep(0)

    task = asyncio.create_task(origin.put_object("data", "a/b", endless()))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert files_under(root / "data") == []


async def test_reader_of_overwritten_object_sees_old_bytes_only(
    origin: PosixOrigin, root: Path
) -> None:
    old, new = b"A" * (3 * MIB), b"B" * (3 * MIB)
    await origin.put_object("data", "ckpt", body(old))
    async with await origin.get_object("data", "ckpt") as stream:
        chunks = stream.chunks()
        first = await anext(chunks)
        await origin.put_object("data", "ckpt", pieces_of(new, MIB))
        rest = b"".join([c async for c in chunks])
    assert first + rest == old
    assert await read_all(origin, "data", "ckpt") == new


async def test_temp_files_are_invisible(origin: PosixOrigin, root: Path) -> None:
    (root / "data" / "d").mkdir()
    (root / "data" / "d" / f"{TEMP_PREFIX}abc").write_bytes(b"in flight")
    (root / "data" / f"{TEMP_PREFIX}def").write_bytes(b"in flight")
    assert await keys(origin, "data") == []
    assert await keys(origin, "data", delimiter="/") == []
    with pytest.raises(NoSuchKey):
        await origin.head_object("data", f"d/{TEMP_PREFIX}abc")
    with pytest.raises(InvalidObjectName):
        await origin.put_object("data", f"d/{TEMP_PREFIX}abc", body(b"x"))


async def test_parent_that_is_a_file_is_a_clear_error(origin: PosixOrigin, root: Path) -> None:
    await origin.put_object("data", "a", body(b"file"))
    for key in ("a/b", "a/b/c"):
        with pytest.raises(InvalidObjectName, match="parent of the key is a file"):
            await origin.put_object("data", key, body(b"x"))
    assert files_under(root / "data") == ["a"]


async def test_key_naming_a_directory_is_refused(origin: PosixOrigin, root: Path) -> None:
    await origin.put_object("data", "a/b", body(b"x"))
    (root / "data" / "link").symlink_to(root / "data" / "a")
    for key in ("a", "link"):
        with pytest.raises(InvalidObjectName, match="directory"):
            await origin.put_object("data", key, body(b"x"))
    assert await keys(origin, "data") == ["a/b", "link/b"]


async def test_folder_marker_makes_a_directory(origin: PosixOrigin, root: Path) -> None:
    result = await origin.put_object("data", "folder/sub/", body())
    assert result.etag == quoted_md5(b"") and result.size == 0
    assert (root / "data" / "folder" / "sub").is_dir()
    with pytest.raises(InvalidObjectName):
        await origin.put_object("data", "folder/x/", body(b"content"))
    await origin.delete_object("data", "folder/sub/")
    assert files_under(root / "data") == []


async def test_missing_bucket(origin: PosixOrigin) -> None:
    with pytest.raises(NoSuchBucket):
        await origin.put_object("nope-bucket", "k", body(b"x"))
    with pytest.raises(NoSuchBucket):
        await origin.delete_object("nope-bucket", "k")


async def test_fsync_mode_writes_the_same(root: Path) -> None:
    origin = PosixOrigin("nfs", root, fsync=True)
    await origin.put_object("data", "k", body(b"durable"))
    assert await read_all(origin, "data", "k") == b"durable"


async def test_without_xattrs_only_the_bytes_are_kept(
    origin: PosixOrigin, monkeypatch: pytest.MonkeyPatch
) -> None:
    def enotsup(*args: object) -> None:
        raise OSError(95, "Operation not supported")

    monkeypatch.setattr(os, "setxattr", enotsup)
    result = await origin.put_object("data", "x.txt", body(b"x"), metadata={"a": "b"})
    info = await origin.head_object("data", "x.txt")
    assert (info.content_type, info.metadata) == ("text/plain", {})
    assert info.etag != result.etag  # documented: the fingerprint ETag
    assert await read_all(origin, "data", "x.txt") == b"x"


async def test_stored_etag_yields_to_the_fingerprint_once_the_file_changes(
    origin: PosixOrigin, root: Path
) -> None:
    result = await origin.put_object("data", "k", body(b"abc"), metadata={"m": "1"})
    path = root / "data" / "k"
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1))
    info = await origin.head_object("data", "k")
    assert info.etag != result.etag and info.metadata == {"m": "1"}
    os.setxattr(path, META_XATTR, b"{not json")
    assert (await origin.head_object("data", "k")).metadata == {}


async def test_metadata_too_large_for_xattrs_writes_nothing(
    origin: PosixOrigin, root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    await origin.put_object("data", "k", body(b"old"))

    def too_big(*args: object) -> None:
        raise OSError(errno.E2BIG, "Argument list too long")

    monkeypatch.setattr(os, "setxattr", too_big)
    with pytest.raises(MetadataTooLarge):
        await origin.put_object("data", "k", body(b"new"), metadata={"m": "x" * 10_000})
    assert await read_all(origin, "data", "k") == b"old"
    assert files_under(root / "data") == ["k"]


# -- delete ------------------------------------------------------------------------


async def test_delete_prunes_empty_parents_only(origin: PosixOrigin, root: Path) -> None:
    await origin.put_object("data", "a/b/c/one", body(b"1"))
    await origin.put_object("data", "a/keep", body(b"2"))
    await origin.delete_object("data", "a/b/c/one")
    assert files_under(root / "data") == ["a", "a/keep"]
    await origin.delete_object("data", "a/keep")
    assert files_under(root / "data") == []
    assert (root / "data").is_dir()  # the bucket stays


async def test_delete_missing_key_and_directories_are_no_ops(
    origin: PosixOrigin, root: Path
) -> None:
    await origin.delete_object("data", "never/was")
    await origin.put_object("data", "dir/file", body(b"x"))
    await origin.delete_object("data", "dir")
    await origin.delete_object("data", "dir/")  # not empty: kept
    assert files_under(root / "data") == ["dir", "dir/file"]


async def test_root_mode_delete_keeps_top_level_directories(
    origin: PosixOrigin, root: Path
) -> None:
    await origin.put_object("", "data/x/y", body(b"x"))
    await origin.delete_object("", "data/x/y")
    assert (root / "data").is_dir() and not (root / "data" / "x").exists()
    await origin.delete_object("", "data/")
    assert (root / "data").is_dir()


async def test_delete_removes_a_symlink_not_its_target(origin: PosixOrigin, root: Path) -> None:
    await origin.put_object("data", "real", body(b"x"))
    (root / "data" / "alias").symlink_to(root / "data" / "real")
    await origin.delete_object("data", "alias")
    assert files_under(root / "data") == ["real"]


# -- copy --------------------------------------------------------------------------


async def test_copy_keeps_source_metadata(origin: PosixOrigin) -> None:
    data = os.urandom(2 * MIB + 7)
    await origin.put_object(
        "data",
        "src",
        body(data),
        content_type="text/x-src",
        metadata={"a": "1"},
        headers={"Cache-Control": "no-cache"},
    )
    result = await origin.copy_object(
        "data", "src", "other-bucket", "dst/copy", content_type="ignored/type"
    )
    assert result.etag == quoted_md5(data) and result.size == len(data)
    info = await origin.head_object("other-bucket", "dst/copy")
    assert (info.content_type, info.metadata, info.headers, info.etag) == (
        "text/x-src",
        {"a": "1"},
        {"Cache-Control": "no-cache"},
        result.etag,
    )
    assert await read_all(origin, "other-bucket", "dst/copy") == data


async def test_copy_replace_uses_given_metadata(origin: PosixOrigin) -> None:
    await origin.put_object("data", "src", body(b"x"), metadata={"a": "1"})
    await origin.copy_object(
        "data",
        "src",
        "data",
        "src",
        replace_metadata=True,
        content_type="text/new",
        metadata={"b": "2"},
    )
    info = await origin.head_object("data", "src")
    assert (info.content_type, info.metadata) == ("text/new", {"b": "2"})
    assert await read_all(origin, "data", "src") == b"x"


async def test_copy_of_missing_source(origin: PosixOrigin, root: Path) -> None:
    with pytest.raises(NoSuchKey):
        await origin.copy_object("data", "nope", "data", "dst")
    assert files_under(root / "data") == []


# -- multipart ---------------------------------------------------------------------


def s3_multipart_etag(parts: Iterable[bytes]) -> str:
    digests = [hashlib.md5(p).digest() for p in parts]
    return f'"{hashlib.md5(b"".join(digests)).hexdigest()}-{len(digests)}"'


async def test_multipart_full_cycle(origin: PosixOrigin, root: Path) -> None:
    parts = [os.urandom(5 * MIB), os.urandom(5 * MIB), b"z"]
    upload_id = await origin.create_multipart_upload(
        "data", "big/model.ckpt", content_type="application/x-ckpt", metadata={"step": "100"}
    )
    assert (await origin.list_multipart_uploads("data"))[0].upload_id == upload_id
    infos = []
    for number, data in enumerate(parts, 1):
        infos.append(
            await origin.upload_part(
                "data", "big/model.ckpt", upload_id, number, pieces_of(data, MIB)
            )
        )
    assert [(i.part_number, i.etag, i.size) for i in infos] == [
        (n, quoted_md5(d), len(d)) for n, d in enumerate(parts, 1)
    ]
    listed = await origin.list_parts("data", "big/model.ckpt", upload_id)
    assert [(p.part_number, p.etag, p.size) for p in listed] == [
        (i.part_number, i.etag, i.size) for i in infos
    ]
    result = await origin.complete_multipart_upload(
        "data", "big/model.ckpt", upload_id, [(i.part_number, i.etag) for i in infos]
    )
    assert result.etag == s3_multipart_etag(parts)
    assert result.size == sum(map(len, parts))
    info = await origin.head_object("data", "big/model.ckpt")
    assert (info.etag, info.size, info.last_modified) == (
        result.etag,
        result.size,
        result.last_modified,
    )
    assert (info.content_type, info.metadata) == ("application/x-ckpt", {"step": "100"})
    page = await origin.list_objects("data", prefix="big/")
    assert [(e.key, e.etag) for e in page.entries] == [("big/model.ckpt", result.etag)]
    assert await read_all(origin, "data", "big/model.ckpt") == b"".join(parts)
    assert files_under(root / STAGING_DIR) == []
    assert await origin.list_multipart_uploads("data") == []
    with pytest.raises(NoSuchUpload):
        await origin.list_parts("data", "big/model.ckpt", upload_id)


async def test_complete_falls_back_when_the_kernel_cannot_copy(
    origin: PosixOrigin, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_copy = os.copy_file_range
    calls = []

    def copy_once_then_exdev(src: int, dst: int, count: int, *args: int) -> int:
        calls.append(count)
        if len(calls) == 1:  # part 1: a short kernel copy, then the kernel gives up
            return real_copy(src, dst, 1000, *args)
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(os, "copy_file_range", copy_once_then_exdev)
    parts = [os.urandom(5 * MIB + 3), os.urandom(1234)]
    upload_id = await origin.create_multipart_upload("data", "k")
    infos = [
        await origin.upload_part("data", "k", upload_id, n, body(data))
        for n, data in enumerate(parts, 1)
    ]
    await origin.complete_multipart_upload(
        "data", "k", upload_id, [(i.part_number, i.etag) for i in infos]
    )
    assert await read_all(origin, "data", "k") == b"".join(parts)
    assert len(calls) == 3


async def test_part_reupload_replaces_and_unquoted_etags_match(origin: PosixOrigin) -> None:
    upload_id = await origin.create_multipart_upload("data", "k")
    await origin.upload_part("data", "k", upload_id, 1, body(b"first"))
    part = await origin.upload_part("data", "k", upload_id, 1, body(b"second"))
    assert [p.etag for p in await origin.list_parts("data", "k", upload_id)] == [part.etag]
    result = await origin.complete_multipart_upload(
        "data", "k", upload_id, [(1, part.etag.strip('"').upper())]
    )
    assert result.etag == s3_multipart_etag([b"second"])
    assert await read_all(origin, "data", "k") == b"second"


async def test_complete_checks_like_s3(origin: PosixOrigin, root: Path) -> None:
    upload_id = await origin.create_multipart_upload("data", "k")
    small = await origin.upload_part("data", "k", upload_id, 1, body(b"small"))
    last = await origin.upload_part("data", "k", upload_id, 2, body(b"last"))
    with pytest.raises(InvalidPart):
        await origin.complete_multipart_upload("data", "k", upload_id, [(1, quoted_md5(b"?"))])
    with pytest.raises(InvalidPart):
        await origin.complete_multipart_upload("data", "k", upload_id, [(3, last.etag)])
    with pytest.raises(InvalidPart):
        await origin.complete_multipart_upload("data", "k", upload_id, [])
    with pytest.raises(InvalidPartOrder):
        await origin.complete_multipart_upload(
            "data", "k", upload_id, [(2, last.etag), (1, small.etag)]
        )
    with pytest.raises(InvalidPartOrder):
        await origin.complete_multipart_upload(
            "data", "k", upload_id, [(1, small.etag), (1, small.etag)]
        )
    with pytest.raises(EntityTooSmall):
        await origin.complete_multipart_upload(
            "data", "k", upload_id, [(1, small.etag), (2, last.etag)]
        )
    with pytest.raises(InvalidArgument):
        await origin.upload_part("data", "k", upload_id, 10_001, body(b"x"))
    assert files_under(root / "data") == []  # nothing written by any failed complete
    result = await origin.complete_multipart_upload("data", "k", upload_id, [(2, last.etag)])
    assert result.size == 4  # a subset of the parts is fine, as in S3


async def test_failed_part_leaves_no_part(origin: PosixOrigin, root: Path) -> None:
    upload_id = await origin.create_multipart_upload("data", "k")
    with pytest.raises(Boom):
        await origin.upload_part("data", "k", upload_id, 1, failing(b"x" * MIB))
    assert await origin.list_parts("data", "k", upload_id) == []
    assert temp_files(root) == []


async def test_abort_cleans_staging(origin: PosixOrigin, root: Path) -> None:
    upload_id = await origin.create_multipart_upload("data", "k")
    await origin.upload_part("data", "k", upload_id, 1, body(b"x" * 1000))
    await origin.abort_multipart_upload("data", "k", upload_id)
    assert files_under(root / STAGING_DIR) == []
    for call in (
        origin.abort_multipart_upload("data", "k", upload_id),
        origin.list_parts("data", "k", upload_id),
        origin.upload_part("data", "k", upload_id, 2, body(b"x")),
        origin.complete_multipart_upload("data", "k", upload_id, [(1, quoted_md5(b"x"))]),
    ):
        with pytest.raises(NoSuchUpload):
            await call
    assert files_under(root / "data") == []


async def test_upload_ids_belong_to_their_key_and_cannot_name_paths(origin: PosixOrigin) -> None:
    upload_id = await origin.create_multipart_upload("data", "k")
    with pytest.raises(NoSuchUpload):
        await origin.list_parts("data", "other", upload_id)
    with pytest.raises(NoSuchUpload):
        await origin.list_parts("other-bucket", "k", upload_id)
    for bad in ("", "..", "../data", f"{upload_id}/../{upload_id}", "x" * 200):
        with pytest.raises(NoSuchUpload):
            await origin.upload_part("data", "k", bad, 1, body(b"x"))
        with pytest.raises(NoSuchUpload):
            await origin.abort_multipart_upload("data", "k", bad)


async def test_list_multipart_uploads(origin: PosixOrigin) -> None:
    b = await origin.create_multipart_upload("data", "logs/b")
    a1 = await origin.create_multipart_upload("data", "logs/a")
    a2 = await origin.create_multipart_upload("data", "logs/a")
    await origin.create_multipart_upload("data", "zzz")
    await origin.create_multipart_upload("other-bucket", "logs/a")
    uploads = await origin.list_multipart_uploads("data", prefix="logs/")
    assert [(u.key, u.upload_id) for u in uploads] == [
        ("logs/a", a1),
        ("logs/a", a2),
        ("logs/b", b),
    ]
    assert uploads[0].initiated <= uploads[1].initiated
    assert uploads[0].initiated.tzinfo is not None
    assert len(await origin.list_multipart_uploads("data")) == 4
    with pytest.raises(NoSuchBucket):
        await origin.list_multipart_uploads("nope-bucket")


async def test_upload_part_copy(origin: PosixOrigin) -> None:
    source = os.urandom(6 * MIB)
    await origin.put_object("other-bucket", "src", body(source))
    upload_id = await origin.create_multipart_upload("data", "k")
    p1 = await origin.upload_part_copy("data", "k", upload_id, 1, "other-bucket", "src", None)
    p2 = await origin.upload_part_copy("data", "k", upload_id, 2, "other-bucket", "src", (10, 19))
    assert (p1.etag, p2.etag, p2.size) == (quoted_md5(source), quoted_md5(source[10:20]), 10)
    await origin.complete_multipart_upload("data", "k", upload_id, [(1, p1.etag), (2, p2.etag)])
    assert await read_all(origin, "data", "k") == source + source[10:20]


async def test_cleanup_stale_uploads(origin: PosixOrigin, root: Path) -> None:
    old = await origin.create_multipart_upload("data", "old")
    fresh = await origin.create_multipart_upload("data", "fresh")
    await origin.upload_part("data", "fresh", fresh, 1, body(b"x"))
    long_ago = time.time() - 7200
    for path in [root / STAGING_DIR / old, *(root / STAGING_DIR / old).iterdir()]:
        os.utime(path, (long_ago, long_ago))
    assert await origin.cleanup_stale_uploads(3600) == 1
    assert [u.upload_id for u in await origin.list_multipart_uploads("data")] == [fresh]


# -- the staging area is invisible ---------------------------------------------------


async def test_staging_is_never_a_bucket_key_or_prefix(origin: PosixOrigin, root: Path) -> None:
    upload_id = await origin.create_multipart_upload("", "data/k")
    await origin.upload_part("", "data/k", upload_id, 1, body(b"x"))
    assert (root / STAGING_DIR / upload_id / "part-00001").exists()
    assert [b.name for b in await origin.list_buckets()] == ["data", "other-bucket"]
    assert await keys(origin, "") == []
    assert await keys(origin, "", delimiter="/") == []
    assert await keys(origin, "", prefix=STAGING_DIR) == []
    staged = f"{STAGING_DIR}/{upload_id}/part-00001"
    with pytest.raises(NoSuchKey):
        await origin.head_object("", staged)
    with pytest.raises(NoSuchBucket):
        await origin.head_bucket(STAGING_DIR)
    for key in (staged, STAGING_DIR, f"{STAGING_DIR}/x"):
        with pytest.raises(InvalidObjectName):
            await origin.put_object("", key, body(b"x"))
        await origin.delete_object("", key)  # missing, as HEAD says: a no-op
    (root / "data" / "sneaky").symlink_to(root / STAGING_DIR)
    assert await keys(origin, "data") == []
    with pytest.raises(InvalidObjectName):
        await origin.put_object("data", "sneaky/x", body(b"x"))
    assert (root / STAGING_DIR / upload_id / "part-00001").exists()


# -- traversal ---------------------------------------------------------------------

BAD_KEYS = [
    "../outside/evil",
    "../../outside/evil",
    "a/../../outside/evil",
    "./x",
    "a/./b",
    "/abs",
    "//abs",
    "a//b",
    "x\0",
    "..",
    ".",
    "",
    "/",
    "bad\udcff",
]


@pytest.mark.parametrize("key", BAD_KEYS)
async def test_traversal_is_refused_by_every_write(
    origin: PosixOrigin, root: Path, key: str
) -> None:
    calls = [
        lambda: origin.put_object("data", key, body(b"x")),
        lambda: origin.put_object("", key, body(b"x")),
        lambda: origin.delete_object("data", key),
        lambda: origin.copy_object("data", "src", "data", key),
        lambda: origin.copy_object("data", key, "data", "dst"),
        lambda: origin.create_multipart_upload("data", key),
        lambda: origin.complete_multipart_upload("data", key, "x" * 32, [(1, '"x"')]),
        lambda: origin.upload_part_copy("data", "src", upload_id, 1, "data", key, None),
    ]
    await origin.put_object("data", "src", body(b"source"))
    upload_id = await origin.create_multipart_upload("data", "src")
    for call in calls:
        with pytest.raises(InvalidObjectName):
            await call()
    await origin.abort_multipart_upload("data", "src", upload_id)
    assert files_under(root.parent / "outside") == []
    assert files_under(root / "data") == ["src"]


async def test_symlink_leading_out_cannot_be_written_through(
    origin: PosixOrigin, root: Path
) -> None:
    outside = root.parent / "outside"
    (root / "data" / "out").symlink_to(outside)
    with pytest.raises(InvalidObjectName):
        await origin.put_object("data", "out/evil", body(b"x"))
    with pytest.raises(InvalidObjectName):
        await origin.create_multipart_upload("data", "out/evil")
    (outside / "victim").write_bytes(b"safe")
    await origin.delete_object("data", "out/victim")  # invisible, so missing: a no-op
    assert (outside / "victim").read_bytes() == b"safe"
    # A symlinked file leading out is replaced as a name, never written through.
    (root / "data" / "leak").symlink_to(outside / "victim")
    await origin.put_object("data", "leak", body(b"mine"))
    assert (outside / "victim").read_bytes() == b"safe"
    assert await read_all(origin, "data", "leak") == b"mine"
