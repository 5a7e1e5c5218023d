# cython: language_level=3
# What the compiled twins (``core/_heads.pyx``, ``s3/_signed_form.pyx``,
# ``s3/_sigv4_claim.pyx``) read ASCII bytes with: inline, so no module of its own.

cdef inline unsigned char lower(unsigned char c):
    """``c`` in lower case, if it is an ASCII capital."""
    if 65 <= c <= 90:
        return c + 32
    return c


cdef inline bint starts(const unsigned char* p, Py_ssize_t at, Py_ssize_t n, bytes word):
    """Whether ``p[at:n]`` starts with ``word`` (lower case), compared case-insensitively."""
    cdef Py_ssize_t size = len(word), i
    cdef const unsigned char* w = word
    if at + size > n:
        return False
    for i in range(size):
        if lower(p[at + i]) != w[i]:
            return False
    return True
