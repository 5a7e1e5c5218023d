"""moto's S3 server, with ranged GETs that read only the range.

moto answers ``GET key`` with ``Range: bytes=a-b`` by reading the *whole*
object out of its buffer and slicing it, so an 8 MiB ranged GET of a 256 MiB
object costs moto a 256 MiB read. A real object store's ranged GET costs what
the range costs. Left alone, this would penalise exactly what is being
measured: block and slice caches (Hoard, nginx ``slice``) fetch large objects
in ranges, ``direct`` whole-object reads do not.

The patch is narrow: while moto handles a GET of a key with one plain
``bytes=a-b`` / ``bytes=a-`` range (and no ``partNumber``), ``FakeKey.value``
returns a window that knows the size and reads a slice from the buffer under
the key's lock. moto's own ``_handle_range_header`` then does what it always
does (validate, set Content-Range, slice), on that window. Every other request
is untouched.

Run: ``python -m loadtest.motoserver -H HOST -p PORT`` (the ``moto_server`` options).
"""

from __future__ import annotations

import re
import sys
import threading
from typing import Any

from moto.s3 import models, responses
from moto.server import main as moto_main

_RANGE = re.compile(r"bytes=(\d+)-(\d*)")
_local = threading.local()


class Window:
    """The bytes of a key as far as ``len()`` and ``[a:b]`` are concerned, read lazily."""

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


def _plain_range(value: str) -> bool:
    match = _RANGE.fullmatch(value.strip())
    return bool(match) and (not match.group(2) or int(match.group(1)) <= int(match.group(2)))


def install() -> None:
    whole = models.FakeKey.value

    def value(self: models.FakeKey) -> Any:
        if getattr(_local, "ranged", False):
            return Window(self)
        return whole.fget(self)

    models.FakeKey.value = property(value, whole.fset)  # type: ignore[method-assign]
    original = responses.S3Response.key_response

    def key_response(self: Any, request: Any, full_url: str, headers: Any) -> Any:
        _local.ranged = (
            request.method == "GET"
            and _plain_range(request.headers.get("range", ""))
            and "partnumber" not in full_url.lower()
        )
        try:
            return original(self, request, full_url, headers)
        finally:
            _local.ranged = False

    responses.S3Response.key_response = key_response  # type: ignore[method-assign]


if __name__ == "__main__":
    install()
    moto_main(sys.argv[1:])
