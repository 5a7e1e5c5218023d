# cython: language_level=3, boundscheck=False, wraparound=False
"""``signed_form.py``'s function compiled: one pass over the head's bytes in C.

The same decision as the Python function (whose docstring says what it keeps
and why), which stays the reference: the tests run both over the same inputs
and compare.
"""

from cpython.bytes cimport PyBytes_FromStringAndSize, PyBytes_AS_STRING
from libc.string cimport memcpy

from gateway.core._ascii cimport starts

cdef bytes _AUTHORIZATION = b"authorization"
cdef tuple _DROPPED = (b"x-amz-date", _AUTHORIZATION, b"amz-sdk-invocation-id",
                       b"amz-sdk-request")


cdef Py_ssize_t _name_colon(const unsigned char* p, Py_ssize_t at, Py_ssize_t n, bytes word):
    """Where ``word`` (lower case) and a colon end if ``p[at:]`` starts with both; else 0."""
    cdef Py_ssize_t end = at + len(word)
    return end + 1 if starts(p, at, n, word) and end < n and p[end] == 58 else 0


def signed_form(bytes head):
    cdef const unsigned char* p = head
    cdef Py_ssize_t n = len(head), i = 0, copied = 0, end = 0, filled = 0
    cdef bint dropped = False, authorized = False
    cdef bytes word
    cdef bytes form = PyBytes_FromStringAndSize(NULL, n)
    cdef char* out = PyBytes_AS_STRING(form)
    while i + 1 < n:
        if p[i] != 13 or p[i + 1] != 10:
            i += 1
            continue
        end = 0
        for word in _DROPPED:
            end = _name_colon(p, i + 2, n, word)
            if end:
                authorized = authorized or word is _AUTHORIZATION
                break
        if not end:
            i += 2
            continue
        memcpy(out + filled, p + copied, i - copied)
        filled += i - copied
        while end < n and p[end] != 13 and p[end] != 10:
            end += 1
        copied = i = end
        dropped = True
    if not (dropped and authorized):
        return None
    memcpy(out + filled, p + copied, n - copied)
    filled += n - copied
    return form[:filled]
