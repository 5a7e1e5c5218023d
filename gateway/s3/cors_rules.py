"""A bucket's CORS rules and what they add to an answer: pure functions, no I/O.

S3 answers a request carrying an ``Origin`` header from the bucket's CORS
configuration (the GetBucketCors XML, ``parse_configuration``): the first
rule whose ``AllowedOrigin`` matches the origin and whose ``AllowedMethod``
holds the request's method wins (``matching_rule``), and the answer carries
what that rule allows (``answer_headers``); no rule matching, nothing is
added. An ``AllowedOrigin`` may hold one ``*``, which matches any run of
characters (``https://*.example.com``); a rule allowing ``*`` (any origin) makes
the answer ``Access-Control-Allow-Origin: *`` with no credentials, any other
rule echoes the origin and allows credentials (as S3 does). ``AllowedHeader`` is checked
only for a preflight's ``Access-Control-Request-Headers``, which the origin
answers (``cors.py``), so it is not read here.

Names and values are compared as S3 compares them: exactly (an origin is
case-sensitive, a method is upper case in the configuration and on the wire).

NOTE: moto answers an actual request with the rule's ``Access-Control-Allow-Headers``
too, and ignores the method; S3 does neither, and Hoard answers as S3.
"""

from __future__ import annotations

import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass

from gateway.s3.numbers import natural
from gateway.s3.xml_writes import local_name, root_element

# What S3 names in ``Vary`` of an answer a rule matched: a cache between the
# browser and S3 must not answer another origin (or a preflight) with it.
VARY = "Origin, Access-Control-Request-Headers, Access-Control-Request-Method"


@dataclass(frozen=True, slots=True)
class CorsRule:
    """One ``<CORSRule>`` of a bucket's configuration, as far as an actual request reads it."""

    allowed_origins: tuple[str, ...]
    allowed_methods: tuple[str, ...]
    expose_headers: tuple[str, ...] = ()
    max_age: int | None = None  # MaxAgeSeconds


CorsRules = tuple[CorsRule, ...]  # in the configuration's order: the first match wins
NO_RULES: CorsRules = ()


def parse_configuration(body: bytes) -> CorsRules:
    """The rules of a GetBucketCors answer's ``<CORSConfiguration>`` (the S3 namespace
    optional); ``S3Error(MalformedXML)`` for a body that is not one."""
    root = root_element(body, "CORSConfiguration")
    return tuple(_rule(element) for element in root if local_name(element.tag) == "CORSRule")


def _rule(element: ElementTree.Element) -> CorsRule:
    found: dict[str, list[str]] = {}
    for child in element:
        found.setdefault(local_name(child.tag), []).append((child.text or "").strip())
    max_age = next(iter(found.get("MaxAgeSeconds", [])), None)
    return CorsRule(
        allowed_origins=tuple(found.get("AllowedOrigin", ())),
        allowed_methods=tuple(found.get("AllowedMethod", ())),
        expose_headers=tuple(found.get("ExposeHeader", ())),
        max_age=natural(max_age) if max_age is not None else None,
    )


def origin_matches(allowed: str, origin: str) -> bool:
    """Whether ``origin`` matches one ``AllowedOrigin`` (at most one ``*``, any run)."""
    head, star, tail = allowed.partition("*")
    if not star:
        return allowed == origin
    return (
        len(origin) >= len(head) + len(tail) and origin.startswith(head) and origin.endswith(tail)
    )


def matching_rule(rules: CorsRules, origin: str, method: str) -> CorsRule | None:
    """The first rule allowing ``method`` from ``origin``; None: S3 adds no CORS headers."""
    for rule in rules:
        if method in rule.allowed_methods and any(
            origin_matches(allowed, origin) for allowed in rule.allowed_origins
        ):
            return rule
    return None


def answer_headers(rules: CorsRules, origin: str, method: str) -> dict[str, str]:
    """The CORS headers S3 adds to its answer (success or error) to ``method`` from ``origin``."""
    rule = matching_rule(rules, origin, method)
    if rule is None:
        return {}
    wildcard = "*" in rule.allowed_origins  # S3's "*" even if a named origin matched too
    headers = {
        "Access-Control-Allow-Origin": "*" if wildcard else origin,
        "Access-Control-Allow-Methods": ", ".join(rule.allowed_methods),
    }
    if not wildcard:
        headers["Access-Control-Allow-Credentials"] = "true"
    if rule.expose_headers:
        headers["Access-Control-Expose-Headers"] = ", ".join(rule.expose_headers)
    if rule.max_age is not None:
        headers["Access-Control-Max-Age"] = str(rule.max_age)
    headers["Vary"] = VARY
    return headers
