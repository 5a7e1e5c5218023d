"""The metadata codec of peer answers: objects and pages round-trip, old answers still read."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from gateway.metadata import codec
from gateway.origins.base import ListEntry, ListPage, ObjectInfo

INFO = ObjectInfo("a/b.jpg", 12, '"e1"', datetime(2026, 11, 1, 8, 30, tzinfo=UTC),
                  "image/jpeg", {"label": "cat"}, {"Cache-Control": "max-age=60"},
                  "STANDARD_IA", "v1")  # fmt: skip


def test_an_object_round_trips_as_a_peer_answer() -> None:
    wire = json.loads(json.dumps(codec.jsonable(INFO)))  # what a peer sends and gets
    assert codec.info_from(wire) == INFO


def test_a_page_keeps_its_tuples_across_json() -> None:
    entry = ListEntry("k", 1, '"e"', INFO.last_modified, "STANDARD", ("CRC32",), ("id", "me"))
    page = ListPage([entry], ["dir/"], True, "k")
    back = codec.page_from(json.loads(json.dumps(codec.jsonable(page))))
    assert back == page
    assert back.entries[0].checksum_algorithms == ("CRC32",)
    assert hash(back.entries[0]) == hash(entry)  # entries are compared and hashed as values


def test_an_answer_from_a_node_before_the_codec_is_read() -> None:
    # What the hand-written codec sent (isoformat, "+00:00"): a node not yet upgraded.
    old = json.dumps({"key": "k", "size": 3, "etag": '"e"',
                      "last_modified": "2026-01-01T00:00:00+00:00", "content_type": "text/plain",
                      "metadata": {}, "headers": {}, "storage_class": "STANDARD",
                      "version_id": None})  # fmt: skip
    info = codec.info_from(json.loads(old))
    assert info.last_modified == datetime(2026, 1, 1, tzinfo=UTC)
    assert info.content_type == "text/plain"


@pytest.mark.parametrize("text", ['{"key": "k"}', '{"key": "k", "size": "big", "etag": "e", '
                                  '"last_modified": "2026-01-01T00:00:00Z"}', "[]"])  # fmt: skip
def test_what_is_not_an_object_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        codec.info_from(json.loads(text))
