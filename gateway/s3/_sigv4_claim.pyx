# cython: language_level=3, boundscheck=False, wraparound=False
"""``s3/sigv4_claim.py``'s ``parse_claim`` compiled, for the common case only.

Every header-signed request (boto3, s3fs, s3torchconnector) parses the same
``Authorization`` header shape; in Python that parse, with the check that
every ``x-amz-*`` header is signed, is nearly half of a verification. Here
the well-formed header claim is read off the header's ASCII bytes: the three
components, the Credential's five parts, the request time, the payload hash,
the signed headers, the names of the headers sent. Anything else (a
presigned URL, no ``Authorization``, text not ASCII, no ``x-amz-date`` (the
Date header's form), and every request S3 refuses) goes to the Python
``parse_claim``, from its start: so every error, its code, message and
fields, is the Python's by construction, and this module decides nothing
the Python does not. The tests run both over the same generated requests.

What the Python keeps in ``lru_cache``s (credentials, dates, header lists)
is kept here in dicts of the values seen well formed, each bounded as those.
"""

from libc.string cimport memcmp

from gateway.core._ascii cimport lower

from gateway.s3.signing import format_amz_date, parse_amz_date, query_params
from gateway.s3.sigv4_claim import (
    ALGORITHM,
    PRESIGN_PARAMS,
    Claim,
    _PAYLOAD_MARKER_SET,
    _signed_headers,
    parse_claim_py,
)

cdef extern from "Python.h":
    bint PyUnicode_IS_ASCII(object)
    const char* PyUnicode_AsUTF8AndSize(object, Py_ssize_t*) except NULL

cdef Py_ssize_t _KEPT = 4096  # as the Python's caches: clients repeat these values
cdef dict _credentials = {}  # a well-formed Credential -> (access key, date, region)
cdef dict _times = {}  # a valid x-amz-date -> (timestamp, its amz_date, that date's day)
cdef dict _signed = {}  # a SignedHeaders value -> the tuple of names
cdef str _SCHEME = ALGORITHM + " "
cdef tuple _PRESIGN = PRESIGN_PARAMS


def parse_claim(req):
    claim = _header_claim(req)
    return claim if claim is not None else parse_claim_py(req)


cdef unsigned char _SEPARATOR[256]  # ',' and what str.split() splits on, of ASCII
cdef int _c
for _c in (44, 9, 10, 11, 12, 13, 28, 29, 30, 31, 32):  # ",\t\n\v\f\r", \x1c-\x1f, " "
    _SEPARATOR[_c] = 1


cdef inline bint _hex(unsigned char c):
    return (48 <= c <= 57) or (65 <= c <= 70) or (97 <= c <= 102)


cdef object _header_claim(req):
    """The claim of a plainly well-formed ``Authorization`` header; None: the Python's."""
    headers = req.headers
    authorization = headers.get("Authorization", "")
    if type(authorization) is not str:
        return None
    authorization = (<str>authorization).strip()
    if not authorization or not PyUnicode_IS_ASCII(authorization):
        return None
    raw_query = req.raw_query
    if raw_query:
        params = query_params(raw_query)
        if "signature" in params or any([name in params for name in _PRESIGN]):
            return None  # two mechanisms, or a presigned URL
    if not (<str>authorization).startswith(_SCHEME):
        return None
    parts = _components(authorization, len(_SCHEME))
    if parts is None:
        return None
    credential, signed_value, signature = parts
    scope = _credential(credential)
    if scope is None:
        return None
    access_key, date, region = scope
    amz = headers.get("x-amz-date")
    if type(amz) is not str:
        return None  # none (the Date header's form), or not text
    moment = _time(amz)
    if moment is None:
        return None
    timestamp, amz_date, day = moment
    if date != day:
        return None
    payload_hash = headers.get("x-amz-content-sha256")
    if type(payload_hash) is not str:
        return None
    if payload_hash not in _PAYLOAD_MARKER_SET and not _sha256_hex(payload_hash):
        return None
    signed = _signed.get(signed_value)
    if signed is None:
        signed = _keep(_signed, signed_value, _signed_headers(signed_value))
    if not _all_signed(headers, signed):
        return None
    return Claim(access_key, date, region, signed, signature.lower(), amz_date, timestamp,
                 payload_hash, None)


cdef object _components(str authorization, Py_ssize_t start):
    """Credential, SignedHeaders and Signature (each the last given), as ``_auth_components``
    splits them: on commas and whitespace, each item ``name=value``; None if an item has
    no ``=`` or one of the three is missing (the Python's errors)."""
    cdef Py_ssize_t n, i, first, eq
    cdef const unsigned char* p
    p = <const unsigned char*>PyUnicode_AsUTF8AndSize(authorization, &n)  # ASCII: no copy
    credential = signed = signature = None
    i = start
    while i < n:
        if _SEPARATOR[p[i]]:
            i += 1
            continue
        first = i
        while i < n and p[i] != 61 and not _SEPARATOR[p[i]]:  # the name, to its '='
            i += 1
        if i == n or p[i] != 61:
            return None
        eq = i
        while i < n and not _SEPARATOR[p[i]]:  # the value
            i += 1
        if _named(p + first, eq - first, b"Credential"):
            credential = authorization[eq + 1:i]
        elif _named(p + first, eq - first, b"SignedHeaders"):
            signed = authorization[eq + 1:i]
        elif _named(p + first, eq - first, b"Signature"):
            signature = authorization[eq + 1:i]
    if credential is None or signed is None or signature is None:
        return None
    return credential, signed, signature


cdef inline bint _named(const unsigned char* p, Py_ssize_t n, bytes name):
    return n == len(name) and memcmp(p, <const char*>name, n) == 0


cdef object _credential(str value):
    """``_parse_credential``'s answer for a well-formed Credential, kept; None otherwise."""
    cdef Py_ssize_t n, i
    cdef const unsigned char* p
    kept = _credentials.get(value)
    if kept is not None:
        return kept
    parts = value.split("/")
    if len(parts) != 5:
        return None
    access_key, date, region, service, terminal = parts
    if not access_key or len(date) != 8 or service != "s3" or terminal != "aws4_request":
        return None
    p = <const unsigned char*>PyUnicode_AsUTF8AndSize(date, &n)  # ASCII: the header was
    for i in range(8):
        if not 48 <= p[i] <= 57:
            return None
    return _keep(_credentials, value, (access_key, date, region))


cdef object _time(str amz):
    """``_request_time`` and its formatting for a valid x-amz-date, kept; None otherwise."""
    kept = _times.get(amz)
    if kept is not None:
        return kept
    timestamp = parse_amz_date(amz)
    if timestamp is None:
        return None
    amz_date = format_amz_date(timestamp)
    return _keep(_times, amz, (timestamp, amz_date, amz_date[:8]))


cdef object _keep(dict memo, object key, object value):
    """``value`` kept in ``memo`` under ``key`` (emptied at ``_KEPT``: a crude bound, as the
    Python's caches), and returned."""
    if len(memo) >= _KEPT:
        memo.clear()
    memo[key] = value
    return value


cdef bint _sha256_hex(str value):
    cdef Py_ssize_t n, i
    cdef const unsigned char* p
    if len(value) != 64 or not PyUnicode_IS_ASCII(value):
        return False
    p = <const unsigned char*>PyUnicode_AsUTF8AndSize(value, &n)
    for i in range(64):
        if not _hex(p[i]):
            return False
    return True


cdef bint _all_signed(headers, tuple signed):
    """Whether ``_check_headers_signed`` passes: Host and every ``x-amz-*`` header signed
    (header names not ASCII: False, the Python's to judge)."""
    cdef Py_ssize_t n
    cdef const unsigned char* p
    if "host" not in signed:
        return False
    for name in headers:
        if not isinstance(name, str) or not PyUnicode_IS_ASCII(name):
            return False
        p = <const unsigned char*>PyUnicode_AsUTF8AndSize(name, &n)
        if (n >= 6 and lower(p[0]) == 120 and p[1] == 45 and lower(p[2]) == 97  # "x-a"
                and lower(p[3]) == 109 and lower(p[4]) == 122 and p[5] == 45):  # "mz-"
            if not _among(p, n, signed):
                return False
    return True


cdef bint _among(const unsigned char* p, Py_ssize_t n, tuple signed):
    """Whether the ASCII name ``p`` in lower case is one of ``signed`` (lower case
    already): ``name.lower() in signed``, without making the lower-case name."""
    cdef Py_ssize_t size, i
    cdef const unsigned char* q
    for entry in signed:
        if len(<str>entry) != n or not PyUnicode_IS_ASCII(entry):
            continue  # (a name not ASCII cannot be an ASCII name in lower case)
        q = <const unsigned char*>PyUnicode_AsUTF8AndSize(entry, &size)
        for i in range(n):
            if lower(p[i]) != q[i]:
                break
        else:
            return True
    return False
