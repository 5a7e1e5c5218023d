"""One codec for metadata that leaves a process: the node's store rows and a peer's answers.

``ObjectInfo`` and ``ListPage`` are plain dataclasses; pydantic's adapters turn
them into JSON and back, datetimes, tuples and optional fields included, so
the store and the cluster's wire cannot drift apart (they had a hand-written
codec each). Decoding validates: a row or a peer answer that is not an
``ObjectInfo`` raises ``ValueError`` (pydantic's ``ValidationError``) rather
than building a half object.
"""

from __future__ import annotations

from typing import Any

from pydantic import TypeAdapter

from gateway.origins.base import ListPage, ObjectInfo

_INFO: TypeAdapter[ObjectInfo] = TypeAdapter(ObjectInfo)
_PAGE: TypeAdapter[ListPage] = TypeAdapter(ListPage)


def info_to_json(info: ObjectInfo) -> str:
    return _INFO.dump_json(info).decode()


def info_from_json(text: str | bytes) -> ObjectInfo:
    return _INFO.validate_json(text)


def jsonable(value: ObjectInfo | ListPage) -> dict[str, Any]:
    """``value`` as JSON-ready fields (datetimes as ISO 8601)."""
    adapter: TypeAdapter[Any] = _INFO if isinstance(value, ObjectInfo) else _PAGE
    return adapter.dump_python(value, mode="json")


def info_from(fields: dict[str, Any]) -> ObjectInfo:
    return _INFO.validate_python(fields)


def page_from(fields: dict[str, Any]) -> ListPage:
    return _PAGE.validate_python(fields)
