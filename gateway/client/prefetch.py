"""``prefetch(order, endpoint=...)``: tell Hoard the order a reader is about to read.

Called by a sampler at the start of each epoch, before it yields the first
index; Hoard then fetches ahead of the reader (see ``gateway/prefetch/``).
Registering the same ``stream_id`` again replaces the order (the next epoch).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import Any

from gateway.client.admin import AdminClient


def prefetch(
    order: Iterable[str],
    endpoint: str,
    bucket: str,
    stream_id: str | None = None,
    window: int | str | None = None,
    access_key: str | None = None,
    secret_key: str | None = None,
) -> dict[str, Any]:
    """Register ``order`` (object keys of ``bucket``, in reading order) with Hoard.

    ``window``: bytes to keep fetched ahead of the reader (an int or "512MiB"),
    within the gateway's ``prefetch.max_window``; None takes its default.
    Without ``stream_id`` a new one is made (the answer's ``stream``): pass the
    same id every epoch so each registration replaces the last. Credentials are
    explicit keys or the standard AWS chain. Returns the stream's status;
    raises ``AdminError`` if Hoard refuses (400 with its reason).
    """
    body: dict[str, Any] = {
        "stream": stream_id or uuid.uuid4().hex,
        "bucket": bucket,
        "keys": list(order),
    }
    if window is not None:
        body["window"] = window
    return AdminClient(endpoint, access_key, secret_key).call("POST", "/_hoard/prefetch", body=body)
