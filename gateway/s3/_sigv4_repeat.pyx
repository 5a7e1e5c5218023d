# cython: language_level=3, boundscheck=False, wraparound=False
"""``sigv4_repeat.py``'s ``SignedRepeat`` compiled: a repeat's check with no Python object made.

The Python class, which stays the reference, spends two thirds of a check in
``hashlib``'s wrappers: each object made, copied, updated and finished is an
OpenSSL ``EVP`` context allocated, copied and freed around a few blocks of
SHA-256. Here the three hashes (the canonical request from its lead's state,
then the HMAC's inner and outer from the key's pads) are OpenSSL's SHA-256
on contexts copied as structures, the values streamed into them in place, and
the checks of the date and the values are byte tests, not regular
expressions. The comparison is ``CRYPTO_memcmp``'s, in constant time.

The same decisions as the Python's, in the same order; the tests run both
over the same heads (``tests/test_sigv4_repeat.py``).
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from libc.math cimport fabs
from libc.string cimport memcmp


cdef extern from "openssl/sha.h" nogil:
    ctypedef struct SHA256_CTX:
        pass
    int SHA256_Init(SHA256_CTX* c)
    int SHA256_Update(SHA256_CTX* c, const void* data, size_t n)
    int SHA256_Final(unsigned char* md, SHA256_CTX* c)


cdef extern from "openssl/crypto.h" nogil:
    int CRYPTO_memcmp(const void* a, const void* b, size_t n)


cdef enum:
    _SIGNATURE = 64  # hex digits of an HMAC-SHA256
    _BLOCK = 64  # SHA-256's block
    _DIGEST = 32
    _DATE = 1  # where x-amz-date and the Authorization are in the signed parts
    _AUTHORIZATION = 2
    _TIME = 16  # YYYYMMDDTHHMMSSZ

cdef bytes _ALGORITHM_LINE = b"AWS4-HMAC-SHA256\n"
cdef const char* _HEX = b"0123456789abcdef"


cdef inline bytes _utf8(str text):
    return text.encode("utf-8", "surrogateescape")


cdef inline void _hex(const unsigned char* digest, char* out) noexcept nogil:
    cdef int i
    for i in range(_DIGEST):
        out[2 * i] = _HEX[digest[i] >> 4]
        out[2 * i + 1] = _HEX[digest[i] & 15]


cdef inline int _two(const unsigned char* p, int at) noexcept nogil:
    """The two digits at ``p[at:]`` as a number; -1 if they are not two digits."""
    if not (48 <= p[at] <= 57 and 48 <= p[at + 1] <= 57):
        return -1
    return (p[at] - 48) * 10 + p[at + 1] - 48


cdef bint _plain(bytes value):
    """Visible ASCII, single spaces inside: what a canonical request takes as it is."""
    cdef const unsigned char* p = <const unsigned char*>PyBytes_AS_STRING(value)
    cdef Py_ssize_t n = PyBytes_GET_SIZE(value), i
    for i in range(n):
        if p[i] == 32:
            if i == 0 or i == n - 1 or p[i - 1] == 32:
                return False
        elif not (33 <= p[i] <= 126):
            return False
    return True


cdef class SignedRepeat:
    """What a header-signed request's repeats are checked by (``sigv4_repeat.py``)."""

    cdef bytes _prefix, _day, _scope
    cdef double _midnight, _skew
    cdef tuple _rest  # after the lead: bytes to hash, or where in the parts a value is
    cdef SHA256_CTX _lead, _inner, _outer

    def __init__(self, bytes prefix, bytes day, double midnight, list request,
                 bytes scope_line, signer, double skew):
        cdef bytes key = signer.key, lead
        cdef const unsigned char* k = <const unsigned char*>PyBytes_AS_STRING(key)
        cdef Py_ssize_t first = 0, i, size = PyBytes_GET_SIZE(key)
        cdef unsigned char inner[_BLOCK]
        cdef unsigned char outer[_BLOCK]
        if size > _BLOCK:  # never for a SigV4 key (32 bytes): KeyedHmac's longer-key case
            raise ValueError("an HMAC-SHA256 key longer than a block")
        self._prefix, self._day, self._midnight = prefix, day, midnight
        self._scope, self._skew = scope_line, skew
        while type(request[first]) is not int:
            first += 1
        lead = _utf8("".join(request[:first]))
        SHA256_Init(&self._lead)
        SHA256_Update(&self._lead, PyBytes_AS_STRING(lead), PyBytes_GET_SIZE(lead))
        self._rest = tuple(p if type(p) is int else _utf8(p) for p in request[first:])
        for i in range(_BLOCK):  # RFC 2104: the key, zero-padded, XOR each pad
            inner[i] = (k[i] if i < size else 0) ^ 0x36
            outer[i] = (k[i] if i < size else 0) ^ 0x5C
        SHA256_Init(&self._inner)
        SHA256_Update(&self._inner, inner, _BLOCK)
        SHA256_Init(&self._outer)
        SHA256_Update(&self._outer, outer, _BLOCK)

    def verifies(self, tuple parts, double now):
        cdef bytes authorization = parts[_AUTHORIZATION]
        cdef object date_part = parts[_DATE]
        cdef bytes date, value
        cdef const unsigned char* d
        cdef const unsigned char* signature
        cdef Py_ssize_t size = PyBytes_GET_SIZE(self._prefix), i
        cdef int hour, minute, second
        cdef SHA256_CTX ctx
        cdef unsigned char digest[_DIGEST]
        cdef char hexed[_SIGNATURE]
        cdef char given[_SIGNATURE]
        cdef unsigned char c
        if PyBytes_GET_SIZE(authorization) != size + _SIGNATURE or memcmp(
                PyBytes_AS_STRING(authorization), PyBytes_AS_STRING(self._prefix), size) != 0:
            return False
        if date_part is None:
            return False
        date = <bytes>date_part
        d = <const unsigned char*>PyBytes_AS_STRING(date)
        if PyBytes_GET_SIZE(date) != _TIME or memcmp(d, PyBytes_AS_STRING(self._day), 8) != 0:
            return False
        hour, minute, second = _two(d, 9), _two(d, 11), _two(d, 13)
        if d[8] != 84 or d[15] != 90 or not (0 <= hour < 24 and 0 <= minute < 60
                                             and 0 <= second < 60):  # 'T', 'Z'
            return False
        if fabs(now - (self._midnight + hour * 3600 + minute * 60 + second)) > self._skew:
            return False
        ctx = self._lead
        for piece in self._rest:
            if type(piece) is int:
                found = parts[<Py_ssize_t>piece]
                if found is None:
                    return False
                value = <bytes>found
                if <Py_ssize_t>piece != _DATE and not _plain(value):
                    return False
            else:
                value = <bytes>piece
            SHA256_Update(&ctx, PyBytes_AS_STRING(value), PyBytes_GET_SIZE(value))
        SHA256_Final(digest, &ctx)
        _hex(digest, hexed)
        ctx = self._inner
        SHA256_Update(&ctx, PyBytes_AS_STRING(_ALGORITHM_LINE), PyBytes_GET_SIZE(_ALGORITHM_LINE))
        SHA256_Update(&ctx, d, _TIME)
        SHA256_Update(&ctx, PyBytes_AS_STRING(self._scope), PyBytes_GET_SIZE(self._scope))
        SHA256_Update(&ctx, hexed, _SIGNATURE)
        SHA256_Final(digest, &ctx)
        ctx = self._outer
        SHA256_Update(&ctx, digest, _DIGEST)
        SHA256_Final(digest, &ctx)
        _hex(digest, hexed)
        signature = <const unsigned char*>PyBytes_AS_STRING(authorization) + size
        for i in range(_SIGNATURE):  # S3 takes the hex in either case
            c = signature[i]
            given[i] = c + 32 if 65 <= c <= 90 else c
        return CRYPTO_memcmp(hexed, given, _SIGNATURE) == 0
