# cython: language_level=3, boundscheck=False, wraparound=False
"""``signed_form.py``'s function compiled: one pass over the head's bytes in C.

The same decision as the Python function (whose docstring says what it keeps
and why), which stays the reference: the tests run both over the same inputs
and compare. Lines are found with ``memchr``, and a line's name is compared
with the per-call names only when its first letter could start one.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from libc.stdint cimport uint64_t
from libc.string cimport memchr, memcpy

from gateway.core._ascii cimport lower, starts
from gateway.core.heads import MAX_LINE
from gateway.s3.signed_form import PER_CALL

cdef tuple _NAMES = tuple(PER_CALL)
cdef Py_ssize_t _MAX_LINE = MAX_LINE
cdef enum:
    _SLOTS = 4


cdef bint _ascii(const unsigned char* p, Py_ssize_t n):
    """Whether no byte of ``p[:n]`` has its high bit set, eight at a time."""
    cdef Py_ssize_t i = 0
    cdef uint64_t word, seen = 0
    while i + 8 <= n:
        memcpy(&word, p + i, 8)
        seen |= word
        i += 8
    while i < n:
        seen |= p[i]
        i += 1
    return (seen & 0x8080808080808080ULL) == 0


cdef Py_ssize_t _per_call(const unsigned char* p, Py_ssize_t at, Py_ssize_t n,
                          Py_ssize_t* slot):
    """Where a per-call name and its colon end if the line at ``at`` starts with one
    (its place in ``PER_CALL`` in ``slot``); else 0."""
    cdef Py_ssize_t end
    cdef bytes word
    if at >= n or (lower(p[at]) != 120 and lower(p[at]) != 97):  # 'x', 'a'
        return 0
    for slot[0] in range(_SLOTS):
        word = <bytes>_NAMES[slot[0]]
        end = at + len(word)
        if starts(p, at, n, word) and end < n and p[end] == 58:
            return end + 1
    return 0


def signed_parts(bytes head):
    cdef const unsigned char* p = head
    cdef const unsigned char* found
    cdef Py_ssize_t n = len(head), i, end, filled = 0, copied = 0, slot = 0, first, last
    cdef Py_ssize_t starts_at[_SLOTS]
    cdef Py_ssize_t ends_at[_SLOTS]
    cdef unsigned char c
    cdef bytes form
    cdef char* out
    if not _ascii(p, n):
        return None
    for slot in range(_SLOTS):
        starts_at[slot] = -1
    form = PyBytes_FromStringAndSize(NULL, n)
    out = PyBytes_AS_STRING(form)
    i = 0
    while True:
        found = <const unsigned char*>memchr(p + i, 13, n - i)
        if found == NULL:
            break
        i = found - p
        if i + 1 >= n or p[i + 1] != 10:
            i += 1
            continue
        end = _per_call(p, i + 2, n, &slot)
        if not end:
            i += 2
            continue
        if starts_at[slot] >= 0:
            return None
        first = end
        while end < n and p[end] != 13 and p[end] != 10:
            c = p[end]
            if (c < 32 and c != 9) or c == 127:
                return None
            end += 1
        if end + 1 >= n or p[end] != 13 or p[end + 1] != 10 or end - i - 2 > _MAX_LINE:
            return None
        last = end
        while first < last and (p[first] == 32 or p[first] == 9):
            first += 1
        while last > first and (p[last - 1] == 32 or p[last - 1] == 9):
            last -= 1
        starts_at[slot], ends_at[slot] = first, last
        memcpy(out + filled, p + copied, i - copied)
        filled += i - copied
        copied = i = end
    if starts_at[1] < 0:
        return None
    memcpy(out + filled, p + copied, n - copied)
    filled += n - copied
    return (form[:filled], _value(p, starts_at[0], ends_at[0]), _value(p, starts_at[1], ends_at[1]),
            _value(p, starts_at[2], ends_at[2]), _value(p, starts_at[3], ends_at[3]))


cdef object _value(const unsigned char* p, Py_ssize_t first, Py_ssize_t last):
    if first < 0:
        return None
    return PyBytes_FromStringAndSize(<const char*>p + first, last - first)
