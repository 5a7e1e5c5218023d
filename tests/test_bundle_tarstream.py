"""The client's streaming TAR reader against archives ``tarfile`` writes and the server's own.

Each archive is read through a source whose ``read`` answers as an HTTP
response does (exactly the bytes asked for, fewer only at the end), counting
its calls: a member is two reads, whatever its size.
"""

from __future__ import annotations

import io
import tarfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.client.tarstream import TarFormatError, TarStream
from gateway.s3.bundle import tar

names = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), min_size=1, max_size=160
).filter(lambda name: not name.endswith("/"))  # a name ending in "/" is a directory
members = st.lists(st.tuples(names, st.binary(max_size=3000)), max_size=8)


class Source:
    """``data`` read back as a response reads: ``read(n)`` answers n bytes, fewer at the end."""

    def __init__(self, data: bytes) -> None:
        self._data = io.BytesIO(data)
        self.reads = 0

    def read(self, count: int) -> bytes:
        self.reads += 1
        return self._data.read(count)


def _read(data: bytes) -> list[tuple[str, bytes]]:
    return list(TarStream(Source(data).read))


def _written_by_tarfile(entries: list[tuple[str, bytes]], form: int) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w|", format=form, encoding="utf-8") as archive:
        for name, data in entries:
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), 1_700_000_000
            archive.addfile(info, io.BytesIO(data))
    return out.getvalue()


def _written_by_the_server(entries: list[tuple[str, bytes]]) -> bytes:
    parts = [tar.member(name, len(data), 1_700_000_000) + data + tar.padding(len(data))
             for name, data in entries]  # fmt: skip
    return b"".join(parts) + tar.END


@settings(max_examples=150, deadline=None)
@given(members)
def test_what_tarfile_writes_as_pax_is_read_back(entries):
    assert _read(_written_by_tarfile(entries, tarfile.PAX_FORMAT)) == entries


@settings(max_examples=150, deadline=None)
@given(members)
def test_what_the_server_writes_is_read_back(entries):
    assert _read(_written_by_the_server(entries)) == entries


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.text("abcdé/", min_size=1, max_size=250), st.binary(max_size=900)), max_size=5
    ),
)
def test_gnu_long_names_and_ustar_prefixes_are_read_back(entries):
    entries = [(name.strip("/") or "x", data) for name, data in entries]
    assert _read(_written_by_tarfile(entries, tarfile.GNU_FORMAT)) == entries
    short = [(name, data) for name, data in entries if len(name.encode()) <= 100]
    ustar = [(name.encode().decode("ascii", "replace").replace("\ufffd", "_"), data)
             for name, data in short]  # fmt: skip
    assert _read(_written_by_tarfile(ustar, tarfile.USTAR_FORMAT)) == ustar


def test_a_split_name_is_joined_from_the_ustar_prefix():
    name = "d" * 90 + "/" + "f" * 90
    assert _read(_written_by_tarfile([(name, b"x")], tarfile.USTAR_FORMAT)) == [(name, b"x")]


def test_sizes_in_base_256_and_pax_size_records():
    header = bytearray(tar.member("big", 5, 0))
    header[124:136] = b"\x80" + (5).to_bytes(11, "big")  # GNU base-256
    header[148:156] = b"        "
    header[148:156] = b"%06o\0 " % sum(header)
    assert _read(bytes(header) + b"hello" + tar.padding(5) + tar.END) == [("big", b"hello")]
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as archive:
        info = tarfile.TarInfo("sized")
        info.size, info.pax_headers = 3, {"size": "3"}
        archive.addfile(info, io.BytesIO(b"abc"))
    assert _read(out.getvalue()) == [("sized", b"abc")]


def test_directories_and_links_are_skipped():
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as archive:
        directory = tarfile.TarInfo("dir")
        directory.type = tarfile.DIRTYPE
        archive.addfile(directory)
        link = tarfile.TarInfo("link")
        link.type, link.linkname = tarfile.SYMTYPE, "file"
        archive.addfile(link)
        info = tarfile.TarInfo("file")
        info.size = 2
        archive.addfile(info, io.BytesIO(b"ok"))
    assert _read(out.getvalue()) == [("file", b"ok")]


def test_a_member_is_one_read_of_its_bytes():
    data = bytes(range(256)) * 1000
    source = Source(_written_by_the_server([("a", data), ("b", b"small"), ("c", b"")]))
    assert list(TarStream(source.read)) == [("a", data), ("b", b"small"), ("c", b"")]
    assert source.reads == 6  # a header and its bytes for "a" and "b", "c"'s header, the end


@pytest.mark.parametrize("cut", [0, 100, 512, 700, 1024 + 3])
def test_an_archive_cut_short_is_an_error_not_a_short_member(cut):
    whole = _written_by_the_server([("a", b"x" * 1000), ("b", b"y" * 10)])
    with pytest.raises(TarFormatError):
        _read(whole[:cut])


def test_bytes_that_are_no_tar_are_an_error():
    with pytest.raises(TarFormatError):
        _read(b"<Error>" + bytes(600))
