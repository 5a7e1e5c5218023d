"""The fault-injecting proxy itself: each fault does what it says, at the request it names."""

from __future__ import annotations

import asyncio
import os

import aiohttp
import pytest

from tests.origin_proxy import Fault, OriginProxy, fail_every, fail_nth

pytestmark = pytest.mark.timeout(60)


async def _get(url: str) -> tuple[int, bytes, str]:
    """(status, body received, how the body ended: "ok" or the error's class name)."""
    async with aiohttp.ClientSession() as session, session.get(url) as answer:
        try:
            return answer.status, await answer.read(), "ok"
        except aiohttp.ClientPayloadError as exc:
            return answer.status, b"", type(exc).__name__


def get(url: str) -> tuple[int, bytes, str]:
    return asyncio.run(_get(url))


@pytest.fixture
def stored(origin_client, bucket, proxy: OriginProxy) -> tuple[str, bytes]:
    data = os.urandom(300 * 1024)
    origin_client.put_object(Bucket=bucket, Key="k", Body=data, ACL="public-read")
    return f"{proxy.endpoint}/{bucket}/k", data


def test_reset_and_truncate_cut_the_nth_get_only(proxy, stored):
    url, data = stored
    proxy.faults = fail_nth(2, Fault("truncate", after=1000))
    assert get(url) == (200, data, "ok")
    status, _, ended = get(url)
    assert status == 200 and ended == "ClientPayloadError"
    assert get(url) == (200, data, "ok")
    proxy.reset()
    proxy.faults = fail_nth(1, Fault("reset", after=70_000))
    status, _, ended = get(url)
    assert status == 200 and ended == "ClientPayloadError"
    assert proxy.injected == {"reset": 1}


def test_every_kth_get_answers_a_status(proxy, stored):
    url, _ = stored
    proxy.faults = fail_every(2, Fault("status", status=412))
    answers = [get(url)[0] for _ in range(4)]
    assert answers == [412, 200, 412, 200]
    assert proxy.counts["GetObject"] == 4


def test_a_stall_holds_until_released(proxy, stored):
    url, data = stored
    proxy.faults = fail_nth(1, Fault("stall", after=100))

    async def scenario() -> tuple[int, bytes, str]:
        pending = asyncio.ensure_future(_get(url))
        await asyncio.to_thread(proxy.stalled.wait, 10)
        assert not pending.done()  # held: the event, not a timer, decides
        proxy.release()
        return await pending

    assert asyncio.run(scenario()) == (200, data, "ok")
