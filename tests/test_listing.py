"""paginate(): S3 listing semantics, in unit tests and page by page against moto."""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime

import pytest

from gateway.origins.base import ListEntry, ListPage
from gateway.origins.listing import common_prefix, paginate, prefix_end
from tests.conftest import seed

T0 = datetime(2024, 1, 1, tzinfo=UTC)


def entries(*keys: str) -> list[ListEntry]:
    return [ListEntry(key, 1, '"e"', T0) for key in sorted(keys)]


def names(page: ListPage) -> tuple[list[str], list[str]]:
    return [e.key for e in page.entries], page.common_prefixes


def all_pages(listing: Sequence[ListEntry], **kw: object) -> Iterator[ListPage]:
    marker = str(kw.pop("start_after", ""))
    while True:
        page = paginate(listing, start_after=marker, **kw)  # type: ignore[arg-type]
        yield page
        if not page.is_truncated:
            return
        assert page.next_marker is not None
        marker = page.next_marker


def reference(listing: Sequence[ListEntry], prefix: str, delimiter: str, start_after: str) -> list:
    """Everything paginate should return over all pages: the obvious O(n) way."""
    items: list[str] = []
    for e in listing:
        if not e.key.startswith(prefix):
            continue
        item = common_prefix(e.key, prefix, delimiter) or e.key
        if item > start_after and (not items or items[-1] != item):
            items.append(item)
    return items


BASIC = entries("a", "a/b", "a/c", "a/d/e", "ab", "b/x", "b/y/z", "c")


def test_flat_listing_returns_everything_in_order() -> None:
    page = paginate(BASIC)
    assert names(page) == ([e.key for e in BASIC], [])
    assert not page.is_truncated
    assert page.next_marker == "c"


def test_delimiter_rolls_up_at_first_occurrence_after_prefix() -> None:
    assert names(paginate(BASIC, delimiter="/")) == (["a", "ab", "c"], ["a/", "b/"])
    assert names(paginate(BASIC, prefix="a/", delimiter="/")) == (["a/b", "a/c"], ["a/d/"])
    assert names(paginate(BASIC, prefix="b", delimiter="/")) == ([], ["b/"])
    assert names(paginate(BASIC, prefix="b/", delimiter="/")) == (["b/x"], ["b/y/"])


def test_prefix_filters_and_unknown_prefix_is_empty() -> None:
    assert names(paginate(BASIC, prefix="a/")) == (["a/b", "a/c", "a/d/e"], [])
    page = paginate(BASIC, prefix="zz")
    assert names(page) == ([], []) and page.next_marker is None and not page.is_truncated


def test_key_equal_to_prefix_is_listed_as_itself() -> None:
    listing = entries("d/", "d/x", "d/y/z")
    assert names(paginate(listing, prefix="d/", delimiter="/")) == (["d/", "d/x"], ["d/y/"])


def test_max_keys_counts_keys_and_prefixes_and_marks_truncation() -> None:
    page = paginate(BASIC, delimiter="/", max_keys=2)
    assert names(page) == (["a"], ["a/"])
    assert page.is_truncated and page.next_marker == "a/"


def test_page_ending_on_common_prefix_continues_after_it() -> None:
    page = paginate(BASIC, delimiter="/", start_after="a/", max_keys=2)
    assert names(page) == (["ab"], ["b/"])
    assert page.is_truncated and page.next_marker == "b/"
    last = paginate(BASIC, delimiter="/", start_after="b/", max_keys=2)
    assert names(last) == (["c"], []) and not last.is_truncated and last.next_marker == "c"


def test_exactly_max_keys_items_is_not_truncated() -> None:
    page = paginate(BASIC, delimiter="/", max_keys=5)
    assert len(page.entries) + len(page.common_prefixes) == 5
    assert not page.is_truncated and page.next_marker == "c"


def test_max_keys_zero_is_empty_and_not_truncated() -> None:
    """moto (and AWS, per S3-compatible servers) answer max-keys=0 with an empty page."""
    for max_keys in (0, -1):
        page = paginate(BASIC, delimiter="/", max_keys=max_keys)
        assert page == ListPage([], [], False, None)


def test_start_after_inside_a_common_prefix_skips_that_prefix() -> None:
    """AWS documents it and moto does it: a common prefix must sort after the marker."""
    assert names(paginate(BASIC, delimiter="/", start_after="a/b")) == (["ab", "c"], ["b/"])
    # Without a delimiter the same marker is a plain key cutoff.
    assert names(paginate(BASIC, start_after="a/b"))[0] == [
        "a/c",
        "a/d/e",
        "ab",
        "b/x",
        "b/y/z",
        "c",
    ]
    # Inside a nested prefix the roll-up happens deeper, so a/d/ still follows a/b.
    assert names(paginate(BASIC, prefix="a/", delimiter="/", start_after="a/b")) == (
        ["a/c"],
        ["a/d/"],
    )


def test_start_after_before_prefix_excludes_nothing() -> None:
    assert names(paginate(BASIC, prefix="b/", start_after="a")) == (["b/x", "b/y/z"], [])


def test_multi_character_delimiter() -> None:
    listing = entries("x--q", "x--y--z", "x-a", "y--")
    assert names(paginate(listing, delimiter="--")) == (["x-a"], ["x--", "y--"])
    # Only occurrences after the prefix count: "x--q" minus "x-" is "-q".
    assert names(paginate(listing, prefix="x-", delimiter="--")) == (["x--q", "x-a"], ["x--y--"])


def test_delimiter_other_than_slash() -> None:
    listing = entries("2024-01-01.csv", "2024-01-02.csv", "2024-02-01.csv", "readme")
    page = paginate(listing, prefix="2024-", delimiter="-")
    assert names(page) == ([], ["2024-01-", "2024-02-"])


def test_unicode_orders_by_code_point_like_utf8_bytes() -> None:
    keys = ["z", "é", "日本/a", "😀", "a b", "a+b", "a%2Fb", "\u007f"]
    listing = entries(*keys)
    assert [e.key for e in listing] == sorted(keys, key=lambda k: k.encode())
    assert names(paginate(listing, delimiter="/"))[1] == ["日本/"]


def test_prefix_end() -> None:
    assert prefix_end("a/") == "a0"
    assert prefix_end("") is None
    assert prefix_end("a\U0010ffff") == "b"
    assert prefix_end("\U0010ffff") is None


def test_common_prefix_of_key_with_max_code_point() -> None:
    listing = entries("a\U0010ffff/x", "a\U0010ffff/y", "b")
    assert names(paginate(listing, delimiter="/")) == (["b"], ["a\U0010ffff/"])


class CountingSequence(Sequence[ListEntry]):
    """A listing that counts element reads, to prove paginate does not walk it."""

    def __init__(self, items: list[ListEntry]) -> None:
        self.items, self.reads = items, 0

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i):  # type: ignore[override]
        self.reads += 1
        return self.items[i]


def test_a_million_keys_under_one_prefix_cost_a_few_reads() -> None:
    big = [ListEntry(f"data/{i:07d}", 1, '"e"', T0) for i in range(1_000_000)]
    listing = CountingSequence([ListEntry("a", 1, '"e"', T0), *big, ListEntry("z", 1, '"e"', T0)])
    page = paginate(listing, delimiter="/")
    assert names(page) == (["a", "z"], ["data/"])
    assert listing.reads < 200
    listing.reads = 0
    page = paginate(listing, start_after="data/0500000", max_keys=3)
    assert [e.key for e in page.entries] == ["data/0500001", "data/0500002", "data/0500003"]
    assert listing.reads < 200


@pytest.mark.parametrize("seed", range(20))
def test_paging_matches_reference_on_random_listings(seed: int) -> None:
    rng = random.Random(seed)
    alphabet = ["a", "b", "/", "-", "é", "+", " "]
    keys = {"".join(rng.choices(alphabet, k=rng.randint(1, 6))) for _ in range(300)}
    listing = entries(*keys)
    for _ in range(10):
        prefix = "".join(rng.choices(alphabet, k=rng.randint(0, 2)))
        delimiter = rng.choice(["", "/", "-", "/a", "ab"])
        start_after = rng.choice(["", *rng.sample(sorted(keys), 3), "a/", "b/a"])
        expected = reference(listing, prefix, delimiter, start_after)
        for max_keys in (1, 2, 7, 1000):
            got = []
            for page in all_pages(
                listing,
                prefix=prefix,
                delimiter=delimiter,
                start_after=start_after,
                max_keys=max_keys,
            ):
                page_items = sorted([e.key for e in page.entries] + page.common_prefixes)
                assert len(page_items) <= max_keys
                assert page.next_marker == (page_items[-1] if page_items else None)
                got += page_items
            assert got == expected, (prefix, delimiter, start_after, max_keys)


# -- against moto ---------------------------------------------------------

SEGMENTS = ["a", "b", "data", "x y", "c+d", "é", "日本", "%2F", "z-1", "z-2"]


def moto_keys() -> list[str]:
    """~1500 keys: nested prefixes, spaces, '+', '%', unicode, a multi-char separator."""
    rng = random.Random(7)
    keys = {f"flat-{i:04d}" for i in range(200)}
    keys |= {f"data/shard-{i % 7}/part-{i:05d}.bin" for i in range(700)}
    while len(keys) < 1500:
        depth = rng.randint(1, 4)
        keys.add("/".join(rng.choice(SEGMENTS) for _ in range(depth)) + f"{rng.randint(0, 99)}")
    keys |= {"a/", "x y/", "data/shard-1/"}  # "directory marker" objects
    keys |= {"one--two--three", "one--four", "one-five"}
    return sorted(keys)


@pytest.fixture(scope="module")
def moto_bucket(origin_client) -> tuple[str, list[ListEntry]]:
    bucket = f"listing-{uuid.uuid4().hex[:12]}"
    origin_client.create_bucket(Bucket=bucket)
    keys = moto_keys()
    seed(bucket, dict.fromkeys(keys, b"x"))
    stored = []
    for page in origin_client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        stored += [
            ListEntry(o["Key"], o["Size"], o["ETag"], o["LastModified"]) for o in page["Contents"]
        ]
    assert [e.key for e in stored] == keys  # moto kept every key byte for byte, in our order
    return bucket, stored


def moto_pages(client, bucket: str, **kw: object) -> Iterator[tuple[list[str], list[str], bool]]:
    args = {"Bucket": bucket, **kw}
    while True:
        r = client.list_objects_v2(**args)
        yield (
            [o["Key"] for o in r.get("Contents", [])],
            [p["Prefix"] for p in r.get("CommonPrefixes", [])],
            r["IsTruncated"],
        )
        if not r["IsTruncated"]:
            return
        args = {k: v for k, v in args.items() if k != "StartAfter"}
        args["ContinuationToken"] = r["NextContinuationToken"]


CASES = [
    # (prefix, delimiter, start_after, max_keys)
    ("", "", "", 1000),
    ("", "", "", 97),
    ("", "/", "", 1000),
    ("", "/", "", 3),
    ("data/", "/", "", 2),
    ("data/shard-", "/", "", 4),
    ("data/shard-3/", "", "data/shard-3/part-00100.bin", 50),
    ("", "/", "a/b", 5),  # marker inside the common prefix a/
    ("", "/", "data/", 7),  # marker equal to a common prefix
    ("a", "/", "", 1),
    ("x y/", "/", "", 10),
    ("é", "/", "", 3),
    ("", "--", "", 100),
    ("one-", "--", "", 1),
    ("", "-", "flat-0100", 33),
    ("c+d/", "/", "", 5),
    ("%2F/", "/", "", 5),
    ("nothing-here/", "/", "", 10),
    ("", "/", "zzz", 10),
]


@pytest.mark.parametrize(("prefix", "delimiter", "start_after", "max_keys"), CASES)
def test_pages_match_moto(
    origin_client, moto_bucket, prefix: str, delimiter: str, start_after: str, max_keys: int
) -> None:
    """Page by page: same keys, same common prefixes, same truncation.

    moto's continuation token stands for the last item of the page, which is
    exactly our ``next_marker``, so pages line up one to one.
    """
    bucket, listing = moto_bucket
    kw: dict[str, object] = {"Prefix": prefix, "MaxKeys": max_keys}
    if delimiter:
        kw["Delimiter"] = delimiter
    if start_after:
        kw["StartAfter"] = start_after
    theirs = list(moto_pages(origin_client, bucket, **kw))
    ours = [
        (*names(page), page.is_truncated)
        for page in all_pages(
            listing, prefix=prefix, delimiter=delimiter, start_after=start_after, max_keys=max_keys
        )
    ]
    assert ours == theirs
    assert reference(listing, prefix, delimiter, start_after) == sorted(
        item for keys, prefixes, _ in ours for item in keys + prefixes
    )


def test_max_keys_zero_matches_moto(origin_client, moto_bucket) -> None:
    bucket, listing = moto_bucket
    r = origin_client.list_objects_v2(Bucket=bucket, Delimiter="/", MaxKeys=0)
    assert r["KeyCount"] == 0 and not r["IsTruncated"]
    assert paginate(listing, delimiter="/", max_keys=0) == ListPage([], [], False, None)
