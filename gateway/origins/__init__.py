"""Origins: where the bytes really live, behind one interface.

An origin answers the S3 reads Hoard needs (``base.py``: ``Origin`` —
buckets, HEAD, ranged GET, one listing page) and returns plain values
(``ObjectInfo``, ``ListPage``) and domain errors (``gateway.core.errors``), never
a library's exceptions or HTTP. Two origins implement it:

- ``s3.py`` (with ``s3_get.py``): any S3-compatible store; ``s3_forward.py``
  passes every other S3 request to it as it came, re-signed.
- ``posix.py``: a directory tree (local disk, NFS, Lustre), one concept per
  module beside it: ``posix_keys.py`` (which keys may name a file),
  ``posix_stream.py`` (a file read), ``posix_walk.py`` (a listing),
  ``posix_records.py`` (metadata and ETags in an xattr),
  ``posix_buckets.py``, ``posix_files.py`` (atomic files),
  ``posix_write.py`` and ``posix_multipart.py`` (writes).

A third, ``memory.py``, holds objects in dicts for tests: it counts every
request and can hold them on an event, so a test sees readers pile up on one
miss and releases them, without a server or a sleep.

What an origin can be asked to change — raw forwarding or its own write API
— is its capability (``writable.py``). S3 listing semantics (delimiters,
common prefixes, markers) are one pure function (``listing.py``) that an
origin without native listing (posix) feeds with sorted entries.

Every read request to an origin goes through one guard (``guard.py``): a
priority gate and token buckets (``limits.py``), retries with backoff within
a budget (``retry.py``), a circuit breaker (``breaker.py``), and resumable,
hedged GET bodies (``resume.py``). Callers above never retry on their own.

What this package may import: the standard library, the client libraries
(aiobotocore, aiohttp), ``gateway.core.errors``, ``gateway.config.settings`` (an origin's
own settings), ``gateway.core.priority`` and itself. Nothing here knows the
cache, the cluster, the metadata tiers or the S3 front.

Not guaranteed: an origin is the truth, not a snapshot. A listing of a
changing tree or bucket may or may not show a concurrent change; a posix
file rewritten in place while read may deliver mixed bytes.
"""
