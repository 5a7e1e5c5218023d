"""One codec for metadata that crosses the wire: an owner node's answers to its peers.

``ObjectInfo`` and ``ListPage`` are plain dataclasses; pydantic's adapters turn
them into JSON and back, datetimes, tuples and optional fields included, so
what the answering side writes and the asking side reads cannot drift apart
(they were two hand-written functions). Decoding validates: an answer that is
not an ``ObjectInfo`` raises ``ValueError`` (pydantic's ``ValidationError``),
which the router treats as an owner that did not answer, rather than building
a half object.

The node's store keeps its own row layout (``store.py``): its columns are the
indexable fields and the rest only what differs from the defaults, about 200
bytes an object where this JSON is about 250 — at millions of rows the store's
size is the point, and its rows never leave the node.
"""

from __future__ import annotations

from typing import Any

from pydantic import TypeAdapter

from gateway.origins.base import ListPage, ObjectInfo

_INFO: TypeAdapter[ObjectInfo] = TypeAdapter(ObjectInfo)
_PAGE: TypeAdapter[ListPage] = TypeAdapter(ListPage)


def jsonable(value: ObjectInfo | ListPage) -> dict[str, Any]:
    """``value`` as JSON-ready fields (datetimes as ISO 8601)."""
    adapter: TypeAdapter[Any] = _INFO if isinstance(value, ObjectInfo) else _PAGE
    return adapter.dump_python(value, mode="json")


def info_from(fields: dict[str, Any]) -> ObjectInfo:
    return _INFO.validate_python(fields)


def page_from(fields: dict[str, Any]) -> ListPage:
    return _PAGE.validate_python(fields)
