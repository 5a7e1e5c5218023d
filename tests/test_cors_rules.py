"""A bucket's CORS rules (gateway/s3/cors_rules.py) and how they are held (metadata/bucket_config.py).

Pure functions and one in-memory holder: no server is needed to say which rule
matches an origin, or that a storm of lookups costs one fetch (callers held on
an ``asyncio.Event``, a clock the test moves).
"""

from __future__ import annotations

import asyncio

import pytest

from gateway.core import errors
from gateway.metadata.bucket_config import BucketConfigs
from gateway.s3.cors_rules import (
    VARY,
    CorsRule,
    answer_headers,
    matching_rule,
    origin_matches,
    parse_configuration,
)
from gateway.s3.errors import S3Error

CONFIGURATION = b"""<?xml version="1.0" encoding="UTF-8"?>
<CORSConfiguration xmlns="http://s3.amazonaws.com/doc/2006-03-01/">
  <CORSRule>
    <ID>writers</ID>
    <AllowedOrigin>https://a.example</AllowedOrigin>
    <AllowedMethod>PUT</AllowedMethod>
  </CORSRule>
  <CORSRule>
    <AllowedHeader>*</AllowedHeader>
    <AllowedOrigin>https://*.example</AllowedOrigin>
    <AllowedMethod>GET</AllowedMethod>
    <AllowedMethod>HEAD</AllowedMethod>
    <ExposeHeader>ETag</ExposeHeader>
    <ExposeHeader>x-amz-request-id</ExposeHeader>
    <MaxAgeSeconds>3000</MaxAgeSeconds>
  </CORSRule>
  <CORSRule>
    <AllowedOrigin>*</AllowedOrigin>
    <AllowedMethod>GET</AllowedMethod>
  </CORSRule>
</CORSConfiguration>"""


def test_a_configuration_is_read_rule_by_rule_in_order() -> None:
    rules = parse_configuration(CONFIGURATION)
    assert rules == (
        CorsRule(("https://a.example",), ("PUT",)),
        CorsRule(("https://*.example",), ("GET", "HEAD"), ("ETag", "x-amz-request-id"), 3000),
        CorsRule(("*",), ("GET",)),
    )
    assert parse_configuration(b"<CORSConfiguration/>") == ()  # no namespace: S3 takes both


@pytest.mark.parametrize("body", [b"<Other/>", b"not xml", b'<!DOCTYPE x [<!ENTITY a "b">]><x/>'])
def test_a_body_that_is_no_configuration_is_malformed(body: bytes) -> None:
    with pytest.raises(S3Error) as raised:
        parse_configuration(body)
    assert raised.value.code.name == "MalformedXML"


@pytest.mark.parametrize(
    ("allowed", "origin", "matches"),
    [
        ("https://a.example", "https://a.example", True),
        ("https://a.example", "https://A.example", False),  # exact, as S3 compares
        ("https://a.example", "https://a.example:8443", False),
        ("https://*.example", "https://cdn.a.example", True),
        ("https://*.example", "https://.example", True),  # the star matches an empty run
        ("https://*.example", "http://a.example", False),
        ("https://*.example", "https://a.example.org", False),
        ("*.example", "https://a.example", True),
        ("ab*ba", "aba", False),  # head and tail may not overlap
        ("*", "null", True),
    ],
)
def test_an_allowed_origin_holds_at_most_one_wildcard(allowed, origin, matches) -> None:
    assert origin_matches(allowed, origin) is matches


def test_the_first_rule_naming_the_origin_and_the_method_wins() -> None:
    rules = parse_configuration(CONFIGURATION)
    assert matching_rule(rules, "https://a.example", "PUT") is rules[0]
    assert matching_rule(rules, "https://a.example", "GET") is rules[1]  # the first allows no GET
    assert matching_rule(rules, "https://elsewhere.org", "GET") is rules[2]
    assert matching_rule(rules, "https://elsewhere.org", "HEAD") is None
    assert matching_rule((), "https://a.example", "GET") is None


def test_a_named_origin_is_echoed_with_credentials() -> None:
    headers = answer_headers(parse_configuration(CONFIGURATION), "https://a.example", "GET")
    assert headers == {
        "Access-Control-Allow-Origin": "https://a.example",
        "Access-Control-Allow-Methods": "GET, HEAD",
        "Access-Control-Allow-Credentials": "true",
        "Access-Control-Expose-Headers": "ETag, x-amz-request-id",
        "Access-Control-Max-Age": "3000",
        "Vary": VARY,
    }


def test_any_origin_is_answered_with_a_star_and_no_credentials() -> None:
    headers = answer_headers(parse_configuration(CONFIGURATION), "https://elsewhere.org", "GET")
    assert headers == {
        "Access-Control-Allow-Origin": "*",
        "Access-Control-Allow-Methods": "GET",
        "Vary": VARY,
    }
    assert answer_headers(parse_configuration(CONFIGURATION), "https://x.org", "HEAD") == {}
    both = (CorsRule(("https://a.example", "*"), ("GET",)),)
    assert answer_headers(both, "https://a.example", "GET")["Access-Control-Allow-Origin"] == "*"


# -- held per bucket: bucket_config.BucketConfigs ---------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Origin:
    """A fetch whose answers the test releases; counts the calls that reached it."""

    def __init__(self) -> None:
        self.calls = 0
        self.release = asyncio.Event()
        self.answer: object = ("rules", 1)
        self.failure: Exception | None = None

    async def fetch(self) -> object:
        self.calls += 1
        await self.release.wait()
        if self.failure is not None:
            raise self.failure
        return self.answer


async def test_a_storm_of_lookups_costs_one_fetch_per_ttl() -> None:
    clock, origin = Clock(), Origin()
    held = BucketConfigs(clock=clock)
    storm = [asyncio.create_task(held.get("s", "cors", 60, 10, origin.fetch)) for _ in range(50)]
    await asyncio.sleep(0)  # every task has asked (a turn of the loop, not a wait for time)
    origin.release.set()
    assert await asyncio.gather(*storm) == [("rules", 1)] * 50
    assert origin.calls == 1
    clock.now += 59.9
    assert await held.get("s", "cors", 60, 10, origin.fetch) == ("rules", 1)
    assert origin.calls == 1
    clock.now += 0.2  # past the TTL: asked again
    origin.answer = ("rules", 2)
    assert await held.get("s", "cors", 60, 10, origin.fetch) == ("rules", 2)
    assert origin.calls == 2
    assert await held.get("other", "cors", 60, 10, origin.fetch) == ("rules", 2)
    assert origin.calls == 3  # held per scope


async def test_a_write_forgets_the_bucket_and_a_fetch_under_way_does_not_store() -> None:
    clock, origin = Clock(), Origin()
    held = BucketConfigs(clock=clock)
    origin.release.set()
    await held.get("s", "cors", 60, 10, origin.fetch)
    origin.release.clear()
    held.forget("s")
    before_write = asyncio.create_task(held.get("s", "cors", 60, 10, origin.fetch))
    await asyncio.sleep(0)
    held.forget("s")  # a write acknowledged while that fetch was at the origin
    origin.release.set()
    assert await before_write == ("rules", 1)  # its caller still gets what it read
    origin.answer = ("rules", 2)
    assert await held.get("s", "cors", 60, 10, origin.fetch) == ("rules", 2)
    assert origin.calls == 3
    held.clear()
    await held.get("s", "cors", 60, 10, origin.fetch)
    assert origin.calls == 4


async def test_a_failure_is_held_for_retry_after_and_so_is_what_was_held_before_it() -> None:
    clock, origin = Clock(), Origin()
    held = BucketConfigs(clock=clock)
    origin.failure = errors.OriginUnavailable("down")
    origin.release.set()
    for _ in range(3):  # nothing held: the caller decides; not asked again within 10 s
        with pytest.raises(errors.OriginUnavailable):
            await held.get("s", "cors", 60, 10, origin.fetch)
    assert origin.calls == 1
    origin.failure = None
    clock.now += 10
    assert await held.get("s", "cors", 60, 10, origin.fetch) == ("rules", 1)
    clock.now += 61
    origin.failure = errors.OriginUnavailable("down")
    assert await held.get("s", "cors", 60, 10, origin.fetch) == ("rules", 1)
    clock.now += 9
    assert await held.get("s", "cors", 60, 10, origin.fetch) == ("rules", 1)
    assert origin.calls == 3  # within retry_after of the failure: not asked again
    clock.now += 2
    assert await held.get("s", "cors", 60, 10, origin.fetch) == ("rules", 1)
    assert origin.calls == 4


async def test_at_most_limit_buckets_are_held() -> None:
    clock, origin = Clock(), Origin()
    held = BucketConfigs(limit=2, clock=clock)
    origin.release.set()
    for scope in ("a", "b", "a", "c"):  # "a" asked again: "b" is the least recently asked
        await held.get(scope, "cors", 60, 10, origin.fetch)
    assert origin.calls == 3
    await held.get("a", "cors", 60, 10, origin.fetch)
    assert origin.calls == 3
    await held.get("b", "cors", 60, 10, origin.fetch)
    assert origin.calls == 4
