"""The accepting node's calls to the other nodes of a job: start, poll, cancel their share.

Each is one signed JSON request (``PeerClient.call_json``) to the route that
``http.py`` mounts under ``/_hoard/peer/warm/{id}``. A node that cannot be
reached is an answer too (None), which the caller reports; it never raises.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

from gateway.cluster.peer_client import PeerClient
from gateway.cluster.peers import PREFIX, PeerUnavailable

log = logging.getLogger(__name__)


class ShareClient:
    def __init__(
        self, client: PeerClient, self_url: str, live: Callable[[], list[str]], timeout: float
    ) -> None:
        self._client = client
        self.self_url = self_url
        self._live = live  # this node's current view of the live members
        self._timeout = timeout

    def others(self) -> list[str]:
        """The live nodes besides this one: the ones a new job is shared with."""
        return [url for url in self._live() if url != self.self_url]

    async def start(self, url: str, job_id: str, spec: dict[str, Any], created: float) -> bool:
        answer = await self._call("POST", url, _target(job_id), {"spec": spec, "created": created})
        return answer is not None

    async def poll(self, url: str, job_id: str) -> dict[str, Any] | None:
        return await self._call("GET", url, _target(job_id))

    async def cancel(self, url: str, job_id: str, unpin: bool) -> dict[str, Any] | None:
        return await self._call("DELETE", url, _target(job_id) + ("?unpin=1" if unpin else ""))

    async def _call(
        self, method: str, url: str, target: str, body: Any = None
    ) -> dict[str, Any] | None:
        try:
            status, answer = await self._client.call_json(method, url, target, body, self._timeout)
        except PeerUnavailable as exc:
            log.warning("warm: %s %s failed: %s", method, url, exc)
            return None
        if status >= 300 or not isinstance(answer, dict):
            log.warning("warm: %s %s%s answered %s: %s", method, url, target, status, answer)
            return None
        return answer


def _target(job_id: str) -> str:
    return f"{PREFIX}warm/{quote(job_id, safe='')}"
