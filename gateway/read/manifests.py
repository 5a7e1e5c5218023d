"""A whole small object read through the cache as bytes: a list of keys to come.

Prefetch orders and warm jobs may name their keys in an object of the dataset
(a manifest) instead of in the request. Reading it is an ordinary read through
the reader, cached like any object, bounded in size because it is held whole.
"""

from __future__ import annotations

from gateway.read.reader import Reader


async def read_manifest(reader: Reader, bucket: str, key: str, limit: int) -> bytes:
    """``key`` whole, through the cache.

    :raises ValueError: the object is larger than ``limit`` bytes.
    """
    read = await reader.open_object(bucket, key)
    try:
        if read.length > limit:
            raise ValueError(f"{key} is {read.length} bytes, more than {limit}")
        return await read.read_all()
    finally:
        await read.aclose()
