"""Faults at the origin, end to end: a Hoard process reading moto through the
fault-injecting ``OriginProxy`` (deterministic plans, no timers standing in for
events). Every body is checked byte for byte and every origin GET counted.
"""

from __future__ import annotations

import pytest

from tests.harness import HoardProcess, metric
from tests.origin_proxy import Fault, OriginProxy, fail_every, fail_nth
from tests.test_block_cache import get_many, put
from tests.test_origin_protection import config

pytestmark = pytest.mark.timeout(120)

KiB = 1024
MiB = 1024 * KiB
BLOCK = 256 * KiB


def fault_config(proxy: OriginProxy, **origin: object) -> dict:
    settings = config(proxy, **origin)
    settings["cache"] = {"block_size": "256KiB", "size": "256MiB", "memory": "16MiB",
                         "read_ahead": 2}  # fmt: skip
    return settings


@pytest.mark.parametrize("kind", ["reset", "truncate"])
def test_bodies_cut_mid_way_at_every_fourth_get_are_resumed_unseen(
    tmp_path, proxy, origin_client, bucket, kind
):
    objects = {f"cut/{i}": put(origin_client, bucket, f"cut/{i}", 1 * MiB + 1000) for i in range(8)}
    node = HoardProcess(tmp_path, fault_config(proxy)).start()
    try:
        proxy.reset()
        proxy.faults = fail_every(4, Fault(kind, after=100 * KiB))  # p = 0.25, after a 200
        keys = list(objects)
        bodies = get_many([f"{node.endpoint}/{bucket}/{key}" for key in keys])
        assert bodies == [objects[key] for key in keys]  # no error, no wrong byte
        blocks = 8 * 5
        cut = proxy.injected[kind]
        assert cut >= 5  # (a cut planned for a 1000-byte last block does not happen)
        # Each cut costs one more GET (the rest of its block), not a whole block again.
        assert proxy.counts["GetObject"] == blocks + cut
        resumed = [r for _, r in proxy.ranges if r and int(r[6:].split("-")[0]) % BLOCK]
        assert len(resumed) == cut
        assert metric(node.endpoint, 'hoard_origin_resumes_total{origin="moto"}') == cut
        # The second pass is all cache: the resumed blocks were stored whole.
        proxy.reset()
        assert get_many([f"{node.endpoint}/{bucket}/{key}" for key in keys]) == list(
            objects.values()
        )
        assert proxy.counts["GetObject"] == 0
    finally:
        node.stop()


def test_the_first_block_get_of_a_metadata_miss_resumes_too(tmp_path, proxy, origin_client, bucket):
    data = put(origin_client, bucket, "one", 200 * KiB)  # one block: the miss's GET is all
    node = HoardProcess(tmp_path, fault_config(proxy)).start()
    try:
        proxy.reset()
        proxy.faults = fail_nth(1, Fault("reset", after=50 * KiB))
        assert get_many([f"{node.endpoint}/{bucket}/one"]) == [data]
        assert proxy.injected["reset"] == 1
        # The block as asked, then its rest, from the byte after the break to the object's end.
        assert [r for _, r in proxy.ranges] == [
            f"bytes=0-{BLOCK - 1}",
            f"bytes={50 * KiB}-{200 * KiB - 1}",
        ]
    finally:
        node.stop()
