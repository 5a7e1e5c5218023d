"""Bytes of metadata per object, measured with tracemalloc (``python -m loadtest.metamem``).

Fills a real ``MetadataCache`` the way a read epoch does: N objects' HEAD
answers (as an origin returns them: a fresh key, ETag and content-type string
per object, a datetime, empty metadata and header dicts), and one whole
listing of their N keys walked in origin pages of 1,000. It reports the
bytes tracemalloc sees allocated per object for each, so the README's "memory
per million objects" is a measurement, not an estimate. Keys look like
ImageNet's (``train/n01440764/n01440764_10026.JPEG``).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import gc
import json
import tracemalloc
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from gateway.metadata.memory import MetadataCache, Policy
from gateway.origins.base import ListEntry, ListPage, ObjectInfo
from gateway.origins.listing import paginate

_BASE = datetime(2026, 11, 1, tzinfo=UTC)


def key_of(i: int) -> str:
    return f"train/n{i // 1000:08d}/n{i // 1000:08d}_{i:08d}.JPEG"


def info_of(i: int) -> ObjectInfo:
    return ObjectInfo(
        key_of(i),
        4096,
        '"' + f"{i:032x}" + '"',
        _BASE + timedelta(seconds=i),
        "".join(["image/", "jpeg"]),  # a fresh string per answer, as parsed headers are
    )


def stored_info_of(i: int) -> ObjectInfo:
    """``info_of(i)`` with the headers an S3 origin stores with an SSE-S3 object: a fresh
    dict and strings per answer, a checksum of its own."""
    headers = {
        "".join(["x-amz-server-side-", "encryption"]): "".join(["AES", "256"]),
        "x-amz-checksum-crc32": base64.b64encode(i.to_bytes(4, "big")).decode(),
        "".join(["x-amz-checksum-", "type"]): "".join(["FULL_", "OBJECT"]),
    }
    plain = info_of(i)
    return ObjectInfo(plain.key, plain.size, plain.etag, plain.last_modified,
                      plain.content_type, headers=headers)  # fmt: skip


def entry_of(i: int) -> ListEntry:
    return ListEntry(key_of(i), 4096, '"' + f"{i:032x}" + '"', _BASE + timedelta(seconds=i))


def _heads_bytes(objects: int, answer: Callable[[int], ObjectInfo]) -> int:
    """Bytes a fresh cache allocates holding ``objects`` HEAD answers made by ``answer``."""
    cache = MetadataCache(head_bytes=objects * 4096, listing_bytes=1)
    gc.collect()
    before = tracemalloc.get_traced_memory()[0]
    for i in range(objects):
        cache.put_head(("origin", "bucket"), key_of(i), answer(i), Policy(ttl=1e9))
    gc.collect()
    held = tracemalloc.get_traced_memory()[0] - before
    del cache
    return held


async def measure(objects: int) -> dict[str, float]:
    policy = Policy(ttl=1e9)
    cache = MetadataCache(head_bytes=objects * 2048, listing_bytes=objects * 2048)
    scope = ("origin", "bucket")
    gc.collect()
    tracemalloc.start()
    heads = _heads_bytes(objects, info_of)
    stored = _heads_bytes(objects, stored_info_of)

    async def fetch_page(prefix: str, delimiter: str, after: str, limit: int) -> ListPage:
        first = int(after.rsplit("_", 1)[1][:8]) + 1 if after else 0
        return paginate([entry_of(i) for i in range(first, min(objects, first + limit + 1))],
                        prefix, delimiter, after, limit)  # fmt: skip

    before = tracemalloc.get_traced_memory()[0]
    await cache.listing(scope, "train/", "", "", 1000, policy, fetch_page)
    gc.collect()
    listing = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    return {
        "objects": objects,
        "head_bytes_per_object": round(heads / objects, 1),
        "stored_header_head_bytes_per_object": round(stored / objects, 1),
        "listing_bytes_per_key": round(listing / objects, 1),
        "mib_per_million_heads": round(heads / objects * 1e6 / 2**20, 1),
        "mib_per_million_listed": round(listing / objects * 1e6 / 2**20, 1),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m loadtest.metamem")
    parser.add_argument("--objects", type=int, default=200_000)
    args = parser.parse_args(argv)
    print(json.dumps(asyncio.run(measure(args.objects))))


if __name__ == "__main__":
    main()
