"""GETs on both event loops: uvloop (the default) and the stdlib loop (``event_loop``).

The two loops send a cached disk segment by different code (``s3/body.py``: the
stdlib loop's native ``loop.sendfile``; under uvloop a non-blocking sendfile with a
thread for the rest), as aiohttp runs its file tests with and without sendfile. On
each loop the same reads must come back byte-exact and from the cache (counted at
the origin): a multi-block object whole, ranges across block edges and a suffix
(disk hits: its blocks are larger than the memory tier takes), a small object
(a memory hit), a conditional and a ``response-*`` override.
"""

from __future__ import annotations

import os

import pytest
import requests

from tests.harness import HoardProcess
from tests.test_block_cache import hoard_config

KiB, MiB = 1024, 1024 * 1024
BIG = 3 * MiB + 123 * KiB  # four 1 MiB blocks, the last one short


@pytest.fixture(params=["uvloop", "asyncio"])
def node(request, tmp_path, proxy):
    config = hoard_config(proxy, block_size="1MiB", memory="4MiB", memory_item_max="256KiB")
    running = HoardProcess(tmp_path, {**config, "event_loop": request.param}).start()
    yield running
    running.stop()


def _reads(base: str, big: bytes, small: bytes) -> None:
    whole = requests.get(f"{base}/big.bin", timeout=30)
    assert whole.status_code == 200 and whole.content == big
    for first, last in ((0, 99), (MiB - 10, MiB + 10), (2 * MiB, 3 * MiB + 5)):
        part = requests.get(f"{base}/big.bin", headers={"Range": f"bytes={first}-{last}"},
                            timeout=30)  # fmt: skip
        assert part.status_code == 206
        assert part.content == big[first : last + 1]
        assert part.headers["Content-Range"] == f"bytes {first}-{last}/{len(big)}"
    tail = requests.get(f"{base}/big.bin", headers={"Range": "bytes=-1000"}, timeout=30)
    assert (tail.status_code, tail.content) == (206, big[-1000:])
    assert requests.get(f"{base}/small.bin", timeout=30).content == small


def test_gets_are_the_same_on_either_loop(node, proxy, origin_client, bucket) -> None:
    big, small = os.urandom(BIG), os.urandom(4 * KiB)
    origin_client.put_object(Bucket=bucket, Key="big.bin", Body=big)
    origin_client.put_object(Bucket=bucket, Key="small.bin", Body=small)
    base = f"{node.endpoint}/{bucket}"
    _reads(base, big, small)  # cold: fills the cache
    proxy.reset()
    _reads(base, big, small)  # hits, through each loop's way of sending them
    assert proxy.counts["GetObject"] == 0
    etag = requests.head(f"{base}/big.bin", timeout=30).headers["ETag"]
    unchanged = requests.get(f"{base}/big.bin", headers={"If-None-Match": etag}, timeout=30)
    assert (unchanged.status_code, unchanged.content) == (304, b"")
    signed = node.client().generate_presigned_url("get_object", Params={
        "Bucket": bucket, "Key": "small.bin", "ResponseContentType": "image/png"})  # fmt: skip
    renamed = requests.get(signed, timeout=30)  # an override is for signed requests only
    assert renamed.headers["Content-Type"] == "image/png" and renamed.content == small
    assert proxy.counts["GetObject"] == 0
