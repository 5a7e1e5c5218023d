"""Request heads read straight off the wire: split from a read, and parsed strictly.

A warm hit is a GET of a few hundred bytes answered with a few KiB, and on
that scale aiohttp's parser is a large part of the cost: its C parser is
fast, but each message becomes a ``RawRequestMessage`` with a
``CIMultiDictProxy``, a ``yarl.URL`` built and validated, a payload object,
a place in a queue. The hit path needs the method, the target and a handful
of headers. So the connection (``app/hotwire.py``) first asks two questions
of each read, here:

- ``bodiless_heads``: is the read nothing but whole request heads, each
  announcing no body? A training loader's connection sends one GET, waits
  for its answer, sends the next: nearly every read is exactly one head. If
  the read is anything else (part of a head, a body, a head announcing
  one), the answer is None and the connection hands that read, and every
  later one, to aiohttp as before: where a message ends is then aiohttp's to
  know, and two parsers must never disagree on it.
- ``parse_head``: the head's method, target and headers, for a GET over
  HTTP/1.1 only, and only if it is plainly well formed: ASCII, a request
  line of three parts with an origin-form target, header names that are
  tokens, values without control characters, no header twice, no line
  longer than aiohttp allows. Anything else is None, and aiohttp's parser
  reads the head instead (and refuses it, if it is bad, as it always did).

So nothing here decides what is a valid request. It only recognises the
plain ones, and everything it does not recognise goes to the parser that
decides. Whether a read is "whole heads" is judged conservatively: a head
announces a body by ``Content-Length`` (other than 0), ``Transfer-Encoding``
or ``Upgrade``; a lone LF (a line end some parsers accept and others do not)
makes the read not plain; a blank line ends a head, as in every parser.
"""

from __future__ import annotations

import re

from aiohttp.http import HttpVersion11
from multidict import CIMultiDict
from yarl import URL

from gateway.core.compiled import twin

_END = b"\r\n\r\n"
MAX_LINE = 8190  # aiohttp's max_line_size and max_field_size: longer is aiohttp's to refuse
# Names that announce a body (or a switch of protocol) when they start a header line.
# (A prefix is enough: a name it begins that is not one of these is treated as one.)
_LENGTH, _BODY_NAMES = b"\ncontent-length", (b"\ntransfer-encoding", b"\nupgrade")
_ZERO_LENGTH = re.compile(rb"\ncontent-length:[ \t]*0[ \t]*\r\n")
_TARGET = re.compile(r"/[!-~]*")  # origin-form, printable ASCII, no space
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_BAD_VALUE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")


def bodiless_heads(data: bytes) -> list[bytes] | None:
    """``data`` split into the request heads it consists of, each ending with its blank
    line, if it is nothing but whole heads announcing no body; else None."""
    if not data.endswith(_END):
        return None
    if data.count(b"\n") != data.count(b"\r\n"):
        return None
    lowered = data.lower()
    if any(name in lowered for name in _BODY_NAMES):
        return None
    if _LENGTH in lowered and lowered.count(_LENGTH) != len(_ZERO_LENGTH.findall(lowered)):
        return None
    if data.find(_END) == len(data) - 4:  # one head, the common read
        return [data]
    parts = data.split(_END)
    if parts[-1]:  # blank lines past the last head: not a head of its own
        return None
    return [part + _END for part in parts[:-1]]


class Head:
    """A plain GET's head, with what the hit path reads of aiohttp's ``RawRequestMessage``
    (``method``, ``path``, ``version``, ``headers``, ``url``, and the framing flags, all
    of them off: a plain head keeps the connection open, upgrades nothing, has no body)."""

    __slots__ = ("_url", "headers", "method", "names", "path", "raw")

    version = HttpVersion11
    should_close = False
    upgrade = False
    chunked = False

    def __init__(self, raw: bytes, method: str, path: str, headers: CIMultiDict[str],
                 names: set[str]) -> None:  # fmt: skip
        self.raw = raw  # the head's bytes, for aiohttp's parser if the hit path declines it
        self.method = method
        self.path = path
        self.headers = headers
        self.names = names  # the headers' names in lower case (the parse checked them)
        self._url: URL | None = None

    @property
    def url(self) -> URL:
        """The target as aiohttp's parser builds it (only the access log reads it)."""
        if self._url is None:
            self._url = URL(self.path, encoded=True)
        return self._url


def parse_head(head: bytes) -> Head | None:
    """``head`` (one of ``bodiless_heads``) as a ``Head`` if it is a plain GET over
    HTTP/1.1 that keeps its connection open; None: aiohttp's parser reads it."""
    if not head.startswith(b"GET /") or not head.isascii():
        return None
    lines = head[:-4].decode("ascii").split("\r\n")
    request_line = lines[0].split(" ")
    if len(request_line) != 3 or request_line[2] != "HTTP/1.1":
        return None
    target = request_line[1]
    if len(lines[0]) > MAX_LINE or _TARGET.fullmatch(target) is None:
        return None
    pairs = []
    names = set()
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        if not colon or len(line) > MAX_LINE or _TOKEN.fullmatch(name) is None:
            return None
        lower = name.lower()
        if lower in names or _BAD_VALUE.search(value) is not None:
            return None
        names.add(lower)
        pairs.append((name, value.strip(" \t")))
    if "connection" in names and not keeps_open(pairs):
        return None
    return Head(head, "GET", target, CIMultiDict(pairs), names)


def keeps_open(pairs: list[tuple[str, str]]) -> bool:
    """Whether a ``Connection`` header leaves the connection open and unswitched."""
    for name, value in pairs:
        if name.lower() == "connection":
            options = {option.strip().lower() for option in value.split(",")}
            return not options & {"close", "upgrade"}
    return True


# The Python path, kept: tests compare it with the compiled one (``core/compiled.py``).
bodiless_heads_py, parse_head_py = bodiless_heads, parse_head
_compiled = twin("gateway.core._heads")
if _compiled is not None:
    bodiless_heads, parse_head = _compiled.bodiless_heads, _compiled.parse_head
