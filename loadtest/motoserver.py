"""moto's S3 server, with reads and multipart completions that never hold a whole object.

Three narrow patches; every other request is moto's own, but for plain PUTs and
GETs of the capacity workload's wide set (``motofast.py``). The list of moto's
services, which moto reads from its package directory on every request, is
read once.

1. Ranged GETs read only the range. moto answers ``GET key`` with
   ``Range: bytes=a-b`` by reading the *whole* object out of its buffer and
   slicing it, so an 8 MiB ranged GET of a 256 MiB object costs moto a
   256 MiB read. A real object store's ranged GET costs what the range costs.
   Left alone, this would penalise exactly what is being measured: block and
   slice caches (Hoard, nginx ``slice``) fetch large objects in ranges,
   ``direct`` whole-object reads do not.
2. Whole GETs stream. moto reads the whole object into memory and returns it
   as one ``bytes``: eight clients reading 2 GiB objects directly would cost
   16 GiB of moto's memory. A real store streams.
3. CompleteMultipartUpload does not concatenate. moto joins every part into
   one ``bytearray`` (plus a copy, plus another for a full-object checksum)
   and writes that to a new buffer: a 2 GiB upload costs about 5 GiB of
   moto's memory and twice its size on disk. Here the completed key takes its
   parts' buffers over (already on disk: moto spools anything above ~5 MiB to
   a temporary file) and reads them in order, without copying them. Only uploads with a
   composite checksum (or none) take this path; a full-object checksum
   (moto's default, CRC64NVME) is left to moto, which needs the whole body.

For 1 and 2, while moto handles a GET of a key (no ``partNumber``, no
sub-resource such as ``?acl``) with one plain ``bytes=a-b`` / ``bytes=a-``
range or no range, ``FakeKey.value`` returns a ``Window`` that knows the size,
reads a slice from the buffer under the key's lock, and iterates in 1 MiB
chunks. moto's own ``_handle_range_header`` then does what it always does
(validate, set Content-Range, slice) on that window; without a range, Flask
streams the window.

Run: ``python -m loadtest.motoserver -H HOST -p PORT`` (the ``moto_server`` options).
"""

from __future__ import annotations

import bisect
import io
import re
import sys
import threading
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qs, urlsplit

from moto import backends
from moto.s3 import models, responses
from moto.s3.exceptions import EntityTooSmall, InvalidPart, MalformedXML
from moto.server import main as moto_main

from loadtest import motofast

_RANGE = re.compile(r"bytes=(\d+)-(\d*)")
# GETs of these sub-resources are not reads of the object's bytes.
_SUBRESOURCES = {"acl", "tagging", "legal-hold", "attributes", "retention", "torrent",
                 "uploadid", "partnumber"}  # fmt: skip
CHUNK = 1024 * 1024
_local = threading.local()


class Window:
    """The bytes of a key as far as ``len()``, ``[a:b]`` and iteration are concerned, read lazily."""

    def __init__(self, key: models.FakeKey) -> None:
        self.key = key

    def __len__(self) -> int:
        return self.key.size

    def __bool__(self) -> bool:
        return self.key.size > 0

    def __getitem__(self, span: slice) -> bytes:
        start, stop, _ = span.indices(self.key.size)
        with self.key.lock:
            buffer = self.key._value_buffer
            buffer.seek(start)
            return buffer.read(max(0, stop - start))

    def __iter__(self) -> Iterator[bytes]:
        for start in range(0, self.key.size, CHUNK):  # bounded: size / 1 MiB chunks
            yield self[start : start + CHUNK]


class Joined(io.RawIOBase):
    """A completed multipart object: its parts' buffers, read in order, never copied.

    It stands in for the key's own buffer (``seek``, ``tell``, ``read``), so every
    moto path that reads the key reads this, under the key's lock. It takes the
    parts' buffers over (moto disposes of the parts when the upload completes)
    and closes them when moto disposes of the key.
    """

    def __init__(self, parts: list[models.FakeKey]) -> None:
        super().__init__()
        self.buffers: list[Any] = []
        self.starts: list[int] = []
        total = 0
        for part in parts:
            with part.lock:
                self.buffers.append(part._value_buffer)
                self.starts.append(total)
                total += part.size
                part._value_buffer = io.BytesIO()  # what moto's dispose of the part closes
        self.size = total
        self.pos = 0

    def __len__(self) -> int:
        return self.size

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.size}[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def read(self, size: int | None = -1) -> bytes:
        left = self.size - self.pos if size is None or size < 0 else size
        out = bytearray()
        while left > 0 and self.pos < self.size:  # bounded: one part per turn
            index = bisect.bisect_right(self.starts, self.pos) - 1
            buffer, start = self.buffers[index], self.starts[index]
            end = self.starts[index + 1] if index + 1 < len(self.starts) else self.size
            buffer.seek(self.pos - start)
            chunk = buffer.read(min(left, end - self.pos))
            if not chunk:
                break
            out += chunk
            self.pos += len(chunk)
            left -= len(chunk)
        return bytes(out)

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def close(self) -> None:
        for buffer in self.buffers:
            buffer.close()
        self.buffers = []
        super().close()


def _plain_range(value: str) -> bool:
    match = _RANGE.fullmatch(value.strip())
    return bool(match) and (not match.group(2) or int(match.group(1)) <= int(match.group(2)))


def _reads_bytes(request: Any, full_url: str) -> bool:
    """A GET of the object's bytes, whole or in one plain range."""
    if request.method != "GET":
        return False
    query = {name.lower() for name in parse_qs(urlsplit(full_url).query, keep_blank_values=True)}
    if query & _SUBRESOURCES:
        return False
    wanted = request.headers.get("range", "")
    return not wanted or _plain_range(wanted)


def _complete(self: models.FakeMultipart, body: Any) -> tuple[Any, str, Any]:
    """moto's ``FakeMultipart.complete``, returning a ``Joined`` instead of the joined bytes."""
    builder = models.MultipartChecksumBuilder(
        self.metadata.get("x-amz-checksum-algorithm"), self.metadata.get("x-amz-checksum-type")
    )
    if builder.checksum_type != "COMPOSITE":
        return _COMPLETE(self, body)
    parts: list[models.FakeKey] = []
    md5s = bytearray()
    for number, etag in body:
        part = self.parts.get(number)
        part_etag = part.etag.replace('"', "") if part is not None else None
        if part is None or part_etag != etag.replace('"', ""):
            raise InvalidPart()
        if parts and parts[-1].contentsize < models.S3_UPLOAD_PART_MIN_SIZE:
            raise EntityTooSmall()
        md5s.extend(bytes.fromhex(part_etag))
        builder.addPart(part.value)  # one part in memory at a time
        parts.append(part)
    if not parts:
        raise MalformedXML
    whole = models.md5_hash()
    whole.update(bytes(md5s))
    return Joined(parts), f"{whole.hexdigest()}-{len(parts)}", builder.build()


_COMPLETE = models.FakeMultipart.complete


def install() -> None:
    motofast.install()
    # moto lists its own package directory (a stat per service) on every request to find
    # the service a host names: a third of its time per small GET. The list never changes.
    modules = tuple(backends.list_of_moto_modules())
    backends.list_of_moto_modules = lambda: modules  # type: ignore[assignment]
    whole = models.FakeKey.value

    def value(self: models.FakeKey) -> Any:
        if getattr(_local, "window", False):
            return Window(self)
        return whole.fget(self)

    def set_value(self: models.FakeKey, new_value: Any) -> None:
        if isinstance(new_value, Joined):
            self._value_buffer.close()
            self._value_buffer = new_value
            self.contentsize = len(new_value)
            return
        whole.fset(self, new_value)

    models.FakeKey.value = property(value, set_value)  # type: ignore[method-assign]
    models.FakeMultipart.complete = _complete  # type: ignore[method-assign]
    original = responses.S3Response.key_response

    def key_response(self: Any, request: Any, full_url: str, headers: Any) -> Any:
        _local.window = _reads_bytes(request, full_url)
        try:
            return original(self, request, full_url, headers)
        finally:
            _local.window = False

    responses.S3Response.key_response = key_response  # type: ignore[method-assign]


if __name__ == "__main__":
    install()
    moto_main(sys.argv[1:])
