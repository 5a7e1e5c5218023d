# cython: language_level=3, boundscheck=False, wraparound=False
"""``signed_form.py``'s function compiled: one pass over the head's bytes in C.

The same decision as the Python function (whose docstring says what it keeps
and why), which stays the reference: the tests run both over the same inputs
and compare. Lines are found with ``memchr``, and a line's name is compared
with a per-call name only when its first letters could start it.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from libc.stdint cimport uint64_t
from libc.string cimport memchr, memcpy

from gateway.core._ascii cimport lower, starts
from gateway.core.heads import MAX_LINE
from gateway.s3.signed_form import PER_CALL

cdef bytes _DATE = PER_CALL[0], _AUTHORIZATION = PER_CALL[1]
cdef bytes _INVOCATION = PER_CALL[2], _REQUEST = PER_CALL[3]
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


cdef inline Py_ssize_t _named(const unsigned char* p, Py_ssize_t at, Py_ssize_t n,
                              bytes word) noexcept:
    """Where ``word`` (lower case) and a colon end if ``p[at:]`` starts with both; else 0."""
    cdef Py_ssize_t end = at + len(word)
    return end + 1 if end < n and p[end] == 58 and starts(p, at, n, word) else 0


cdef Py_ssize_t _per_call(const unsigned char* p, Py_ssize_t at, Py_ssize_t n,
                          Py_ssize_t* slot) noexcept:
    """Where a per-call name (``PER_CALL``) and its colon end if the line at ``at`` starts
    with one, its place in ``slot``; else 0. Told apart by their first letters."""
    cdef unsigned char first, second
    cdef Py_ssize_t end
    if at + 1 >= n:
        return 0
    first, second = lower(p[at]), lower(p[at + 1])
    if first == 120:  # x
        slot[0] = 0
        return _named(p, at, n, _DATE)
    if first != 97:  # a
        return 0
    if second == 117:  # u
        slot[0] = 1
        return _named(p, at, n, _AUTHORIZATION)
    if second != 109:  # m
        return 0
    slot[0] = 2
    end = _named(p, at, n, _INVOCATION)
    if not end:
        slot[0] = 3
        end = _named(p, at, n, _REQUEST)
    return end


cdef bint _STOPS[256]  # what ends a value (CR, LF) or makes it a Head's to refuse
cdef int _c
for _c in range(32):
    _STOPS[_c] = _c != 9
_STOPS[127] = True


def signed_parts(bytes head):
    cdef const unsigned char* p = head
    cdef const unsigned char* found
    cdef Py_ssize_t n = len(head), i = 0, end, size, slot = 0, first, last, cut = 0, k
    cdef Py_ssize_t starts_at[_SLOTS]
    cdef Py_ssize_t ends_at[_SLOTS]
    cdef Py_ssize_t cut_from[_SLOTS]  # the lines left out, in the head's order
    cdef Py_ssize_t cut_to[_SLOTS]
    cdef bytes form
    cdef char* out
    if not _ascii(p, n):
        return None
    for slot in range(_SLOTS):
        starts_at[slot] = -1
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
        while end < n and not _STOPS[p[end]]:
            end += 1
        if end + 1 >= n or p[end] != 13 or p[end + 1] != 10 or end - i - 2 > _MAX_LINE:
            return None
        last = end
        while first < last and (p[first] == 32 or p[first] == 9):
            first += 1
        while last > first and (p[last - 1] == 32 or p[last - 1] == 9):
            last -= 1
        starts_at[slot], ends_at[slot] = first, last
        cut_from[cut], cut_to[cut] = i, end
        cut += 1
        i = end
    if starts_at[1] < 0:
        return None
    size = n
    for k in range(cut):
        size -= cut_to[k] - cut_from[k]
    form = PyBytes_FromStringAndSize(NULL, size)
    out = PyBytes_AS_STRING(form)
    i = 0
    for k in range(cut):
        memcpy(out, p + i, cut_from[k] - i)
        out += cut_from[k] - i
        i = cut_to[k]
    memcpy(out, p + i, n - i)
    return (form, _value(p, starts_at[0], ends_at[0]), _value(p, starts_at[1], ends_at[1]),
            _value(p, starts_at[2], ends_at[2]), _value(p, starts_at[3], ends_at[3]))


cdef object _value(const unsigned char* p, Py_ssize_t first, Py_ssize_t last):
    if first < 0:
        return None
    return PyBytes_FromStringAndSize(<const char*>p + first, last - first)
