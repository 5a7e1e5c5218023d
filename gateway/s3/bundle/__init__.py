"""Batch GET: ``POST /{bucket}?bundle`` answers many objects in one streaming TAR.

A training step reads a batch of 64-1,024 small objects, and as single GETs
each pays a request's whole per-request work (parse, signature, lookup,
headers) on both sides. A bundle pays it once per batch. The dialect is the
one Tigris defined, byte for byte as its client (``tigris-boto3-ext``'s
``bundle_objects``) sends and reads it: a SigV4-signed POST whose body lists
the keys (JSON ``{"keys": [...]}`` or XML ``<Bundle><Object><Key>``), options
in ``X-Tigris-Bundle-*`` headers, and a 200 whose chunked body is a TAR, one
regular-file member per present key in request order, named by the key, read
by the client with ``tarfile`` mode ``r|``.

The bundle is a reader of many objects, no more: each key is resolved,
limited and read through the ``Reader``'s public calls as a GET of it would
be (so prefetch and auto-warm see it), and its bytes leave through the
``BodySender`` a GET uses. Unlike AIStore's GetBatch, which answers only what
its cluster holds, a cold key is filled, several at once, while the archive
streams in order.

The parts, one concept each: ``request`` (the options and keys, checked),
``tar`` (member headers by hand), ``ahead`` (keys opened ahead, handed out
in order), ``sink`` (bytes to the chunked answer, plain or gzip),
``operation`` (the S3 operation that combines them).

zstd is answered 501 NotImplemented: gzip comes with Python, and the
objects a training batch holds (JPEG, PNG, compressed shards) gain little
from either; ``zstandard`` is a compiled dependency whose streaming frames
Tigris's own integration test cannot read (no content size in the frame
header). Python 3.14's ``compression.zstd`` would make it free to add.

The ``x-tigris-bundle-*`` totals end every chunked answer as trailers (written
by ``operation``, as aiohttp writes none), and lead a fail-mode answer as
headers. Not guaranteed: a ``__bundle_errors.json`` entry when nothing was
skipped.
"""
