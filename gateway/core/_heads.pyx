# cython: language_level=3, boundscheck=False, wraparound=False
"""``core/heads.py``'s two functions compiled: one pass over the bytes in C.

The same decisions as the pure-Python functions in ``heads.py`` (whose
docstring says what they decide and why), which stay the reference: the
tests run both over the same inputs and compare. Compiled because the pure
functions, a dozen string operations and regular expressions per head, cost
more than aiohttp's own C parser, so they could only pay in C: a byte loop
here is a few hundred nanoseconds per head.
"""

from gateway.core.heads import MAX_LINE, Head, keeps_open

from multidict import CIMultiDict

from gateway.core._ascii cimport lower, starts

cdef bytes _END = b"\r\n\r\n"


cdef bint _zero_length(const unsigned char* p, Py_ssize_t at, Py_ssize_t n):
    """Whether the ``Content-Length`` line at ``at`` says 0 (``:``, blanks, ``0``,
    blanks, CRLF)."""
    cdef Py_ssize_t i = at + 15  # past "content-length:"
    while i < n and (p[i] == 32 or p[i] == 9):
        i += 1
    if i >= n or p[i] != 48:
        return False
    i += 1
    while i < n and (p[i] == 32 or p[i] == 9):
        i += 1
    return i + 1 < n and p[i] == 13 and p[i + 1] == 10


def bodiless_heads(bytes data):
    cdef const unsigned char* p = data
    cdef Py_ssize_t n = len(data), i, line = 0, start = 0
    cdef unsigned char c
    if n < 4 or p[n - 4] != 13 or p[n - 3] != 10 or p[n - 2] != 13 or p[n - 1] != 10:
        return None
    heads = []
    for i in range(n):
        c = p[i]
        if c == 10:
            if i == 0 or p[i - 1] != 13:
                return None  # a lone LF
            if i - 1 == line and line != start:  # an empty line after a line: the head ends
                heads.append(data[start:i + 1])
                start = i + 1
            line = i + 1
            continue
        if i != line or i == 0:  # not the start of a line after the first
            continue
        c = lower(c)
        if c == 99 and starts(p, i, n, b"content-length"):
            if not (starts(p, i, n, b"content-length:") and _zero_length(p, i, n)):
                return None
        elif c == 116 and starts(p, i, n, b"transfer-encoding"):
            return None
        elif c == 117 and starts(p, i, n, b"upgrade"):
            return None
    return heads if start == n else None


cdef bint _token(unsigned char c):
    if c >= 128 or c <= 32 or c == 127:
        return False
    # RFC 9110 tchar: ALPHA, DIGIT and !#$%&'*+-.^_`|~
    if (48 <= c <= 57) or (65 <= c <= 90) or (97 <= c <= 122):
        return True
    return c in b"!#$%&'*+-.^_`|~"


def parse_head(bytes head):
    cdef const unsigned char* p = head
    cdef Py_ssize_t n = len(head) - 2  # the last line's CRLF ends the headers
    cdef Py_ssize_t i, end, at, colon, first, last
    cdef unsigned char c
    if n < 16 or not head.startswith(b"GET /"):
        return None
    # The request line: "GET ", a target of printable ASCII, " HTTP/1.1" and CRLF.
    i = 4
    while i < n and 33 <= p[i] <= 126:
        i += 1
    end = i
    if head[i:i + 11] != b" HTTP/1.1\r\n" or end + 9 > MAX_LINE:
        return None
    target = head[4:end].decode("ascii")
    pairs = []
    names = set()
    at = i + 11
    while at < n:
        colon = at
        while colon < n and _token(p[colon]):
            colon += 1
        if colon == at or colon >= n or p[colon] != 58:
            return None
        i = colon + 1
        while i < n and (p[i] == 32 or p[i] == 9):
            i += 1
        first = i
        last = i
        while i < n and p[i] != 13:
            c = p[i]
            if c >= 127 or (c < 32 and c != 9):
                return None
            i += 1
            if c != 32 and c != 9:
                last = i
        if i >= n or p[i + 1] != 10 or i - at > MAX_LINE:
            return None
        name = head[at:colon].decode("ascii")
        lower = name.lower()
        if lower in names:
            return None
        names.add(lower)
        pairs.append((name, head[first:last].decode("ascii")))
        at = i + 2
    if "connection" in names and not keeps_open(pairs):
        return None
    return Head(head, "GET", target, CIMultiDict(pairs), names)
