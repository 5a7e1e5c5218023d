# cython: language_level=3, boundscheck=False, wraparound=False
"""``s3/sigv4.py``'s ``_check_signature`` compiled, for a signature that matches.

Rebuilding the canonical request (the signed headers' values trimmed and
collapsed, the query sorted, six lines joined) and the string to sign costs,
in Python, about as much as parsing the claim: a dozen strings made and
joined, then encoded. Here both texts are written straight into one buffer
(the common request is ASCII throughout), and the hashing stays hashlib's and
the key's (``core/sigv4_key.py``), the comparison ``hmac.compare_digest``'s.
A path and a query already in canonical form are recognised here; any other
is canonicalised by the Python functions (``_candidate_uris``,
``_canonical_query``), which keep what they computed.

Only the first candidate path is tried, and only a match returns here:
anything else (no match, a signed header missing, text that is not ASCII,
headers without ``getall``) is handed to the Python ``_check_signature``,
which tries every candidate and raises SignatureDoesNotMatch with the fields
it always did. So this module accepts only what the Python accepts at its
first try, and refuses nothing itself. The tests run both over the same
generated requests, and over signatures of other canonical forms.
"""

import hashlib
import hmac

from cpython.bytes cimport PyBytes_FromStringAndSize
from libc.string cimport memcpy

from gateway.s3.sigv4 import _candidate_uris, _canonical_query, _check_signature_py
from gateway.s3.sigv4_claim import ALGORITHM

cdef extern from "Python.h":
    bint PyUnicode_IS_ASCII(object)
    const char* PyUnicode_AsUTF8AndSize(object, Py_ssize_t*) except NULL

cdef enum:
    _ROOM = 8192  # a canonical request longer than this (huge signed headers): the Python's

_sha256 = hashlib.sha256
_compare_digest = hmac.compare_digest
cdef str _HEAD = ALGORITHM + "\n"
cdef unsigned char _SPACE[256]  # what str.split() splits on, of ASCII
cdef int _c
for _c in (9, 10, 11, 12, 13, 28, 29, 30, 31, 32):  # "\t\n\v\f\r", \x1c-\x1f, " "
    _SPACE[_c] = 1


def _check_signature(req, claim, signer):
    if not _matches(req, claim, signer):
        _check_signature_py(req, claim, signer)  # refuses (or matches another candidate)


cdef bint _matches(req, claim, signer) except -1:
    """Whether the signature matches the canonical request with the first candidate path,
    every signed header present, all of it ASCII text: the Python's first try. False:
    not verified here (the Python's to decide), never refused."""
    cdef char text[_ROOM]
    cdef Py_ssize_t at = 0, i, count
    cdef tuple names = claim.signed_headers
    getall = getattr(req.headers, "getall", None)
    raw_path, raw_query = req.raw_path, req.raw_query
    if getall is None or type(raw_path) is not str or type(raw_query) is not str:
        return False
    query = _query(raw_query, claim.expires is not None) if raw_query else ""
    if not (_put(text, &at, req.method) and _byte(text, &at, b"\n")
            and _put(text, &at, _uri(raw_path)) and _byte(text, &at, b"\n")
            and _put(text, &at, query) and _byte(text, &at, b"\n")):
        return False
    for name in names:  # ``_canonical_headers``: "name:value,value\n", trimmed, collapsed
        values = getall(name, ())
        count = len(values)
        if count == 0 or not (_put(text, &at, name) and _byte(text, &at, b":")):
            return False  # (none: a signed header missing, the Python refuses)
        for i in range(count):
            if (i and not _byte(text, &at, b",")) or not _put_collapsed(text, &at, values[i]):
                return False
        if not _byte(text, &at, b"\n"):
            return False
    if not _byte(text, &at, b"\n"):
        return False
    for i in range(len(names)):
        if (i and not _byte(text, &at, b";")) or not _put(text, &at, names[i]):
            return False
    if not (_byte(text, &at, b"\n") and _put(text, &at, claim.payload_hash)):
        return False
    digest = _sha256(PyBytes_FromStringAndSize(text, at)).hexdigest()
    at = 0  # the string to sign, in the same room
    if not (_put(text, &at, _HEAD) and _put(text, &at, claim.amz_date)
            and _byte(text, &at, b"\n") and _put(text, &at, claim.date)
            and _byte(text, &at, b"/") and _put(text, &at, claim.region)
            and _put(text, &at, "/s3/aws4_request\n") and _put(text, &at, digest)):
        return False
    signature = claim.signature
    if type(signature) is not str or not PyUnicode_IS_ASCII(signature):
        return False  # (ASCII, a str compares as its UTF-8 bytes would)
    expected = signer.hexdigest(PyBytes_FromStringAndSize(text, at))
    return _compare_digest(expected, signature)


cdef inline bint _byte(char* text, Py_ssize_t* at, char c):
    if at[0] >= _ROOM:
        return False
    text[at[0]] = c
    at[0] += 1
    return True


cdef bint _put(char* text, Py_ssize_t* at, value) except -1:
    """``value`` appended at ``at`` if it is ASCII text and there is room."""
    cdef Py_ssize_t n
    cdef const char* p
    if type(value) is not str or not PyUnicode_IS_ASCII(value):
        return False
    p = PyUnicode_AsUTF8AndSize(value, &n)  # ASCII: the text itself, no copy
    if at[0] + n > _ROOM:
        return False
    memcpy(text + at[0], p, n)
    at[0] += n
    return True


cdef bint _put_collapsed(char* text, Py_ssize_t* at, value) except -1:
    """``" ".join(value.split())`` appended, for ASCII text (never longer than itself)."""
    cdef Py_ssize_t n, i = 0, word, end
    cdef const unsigned char* p
    if type(value) is not str or not PyUnicode_IS_ASCII(value):
        return False
    p = <const unsigned char*>PyUnicode_AsUTF8AndSize(value, &n)
    if at[0] + n > _ROOM:
        return False
    end = at[0]
    while True:
        while i < n and _SPACE[p[i]]:
            i += 1
        if i == n:
            break
        if end != at[0]:
            text[end] = 32
            end += 1
        word = i
        while i < n and not _SPACE[p[i]]:
            i += 1
        memcpy(text + end, p + word, i - word)
        end += i - word
    at[0] = end
    return True


cdef inline bint _unreserved(unsigned char c):
    return ((48 <= c <= 57) or (65 <= c <= 90) or (97 <= c <= 122) or c == 45 or c == 46
            or c == 95 or c == 126)


cdef inline int _hex(unsigned char c):
    """An upper-case hex digit's value; -1 for anything else."""
    if 48 <= c <= 57:
        return c - 48
    if 65 <= c <= 70:
        return c - 55
    return -1


cdef object _uri(str raw_path):
    """``_candidate_uris(raw_path)[0]``: a path of unreserved characters and slashes is
    its own canonical form. None if the Python's raises (it is the Python's to)."""
    cdef Py_ssize_t n, i
    cdef const unsigned char* p
    if raw_path and PyUnicode_IS_ASCII(raw_path):
        p = <const unsigned char*>PyUnicode_AsUTF8AndSize(raw_path, &n)
        for i in range(n):
            if not (_unreserved(p[i]) or p[i] == 47):
                break
        else:
            return raw_path
    try:
        return _candidate_uris(raw_path)[0]
    except Exception:
        return None


cdef bint _canonical(str query):
    """Whether ``query`` matches ``sigv4._CANONICAL_QUERY``: items of unreserved characters
    and escapes of other bytes (upper-case hex), each with at most one ``=``."""
    cdef Py_ssize_t n, i = 0
    cdef const unsigned char* p
    cdef int high, low
    cdef unsigned char c
    cdef bint named = False  # an '=' in this item already
    if not PyUnicode_IS_ASCII(query):
        return False
    p = <const unsigned char*>PyUnicode_AsUTF8AndSize(query, &n)
    while i < n:
        c = p[i]
        if c == 37:  # '%'
            if i + 2 >= n:
                return False
            high, low = _hex(p[i + 1]), _hex(p[i + 2])
            if high < 0 or low < 0 or _unreserved(<unsigned char>(high * 16 + low)):
                return False
            i += 3
            continue
        if c == 38:  # '&'
            named = False
        elif c == 61:  # '='
            if named:
                return False
            named = True
        elif not _unreserved(c):
            return False
        i += 1
    return True


cdef object _query(str raw_query, bint presigned):
    """``_canonical_query``: a canonical query sorted here; any other, the Python's. None
    if the Python's raises (it is the Python's to)."""
    if not _canonical(raw_query):
        try:
            return _canonical_query(raw_query, presigned=presigned)
        except Exception:
            return None
    pairs = []
    for item in raw_query.split("&"):
        if not item:
            continue
        name, _, value = (<str>item).partition("=")
        if presigned and (<str>name).lower() == "x-amz-signature":
            continue  # the signature cannot sign itself
        pairs.append((name, value))
    pairs.sort()
    return "&".join([f"{name}={value}" for name, value in pairs])
