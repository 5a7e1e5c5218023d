"""The S3 front: HTTP requests in, S3 answers out.

Everything S3-shaped about Hoard's protocol lives here, and nothing else
does: ``routing.py`` turns a request line into (bucket, key, operation) using
the one table of S3 operations; ``auth.py`` verifies SigV4 (``sigv4.py``, its
requests' claims parsed in ``sigv4_claim.py``; the well-formed case of each
compiled beside it, ``_sigv4.pyx`` and ``_sigv4_claim.pyx``, everything else
handed to the Python: ``core/compiled.py``) or
SigV2 (``sigv2.py``) and the anonymous policy; ``front.py`` dispatches to one
handler module per family of operations (``objects.py`` GET/HEAD,
``listing.py``, ``buckets.py``, ``writes.py`` for origins written through
their own API (``upload_lists.py`` pages their multipart uploads), ``passthrough.py`` for everything forwarded); ``errors.py`` is
the one table of S3 error codes and the one translation from domain errors;
``xml.py`` and ``xml_writes.py`` write the bodies. Request details each have
their module: ``ranges.py``, ``conditionals.py``, ``chunked.py``
(aws-chunked bodies), ``checksums.py`` (a body's), ``object_checksums.py`` (the
checksum headers an object's GET or HEAD carries), ``numbers.py``; ``cors.py`` the
preflights passed on and the CORS headers of Hoard's own answers, whose rules
``cors_rules.py`` reads and evaluates. ``body.py`` sends an
object body: bytes as they are, file segments with sendfile. ``hits.py`` is
the hit path (a small object held, answered inside the connection's
protocol), ``express.py`` its hits answered again from their bytes (a
header-signed one by its signed form, ``signed_form.py``, compiled beside it
as ``_signed_form.pyx``; its repeats' signatures checked from their per-call
values by ``sigv4_repeat.py``, compiled as ``_sigv4_repeat.pyx``), and
``hit_bytes.py`` what both write.

Handlers translate and delegate: they call the reader (``gateway/read/reader.py``)
for reads and the writer (``gateway/write/writer.py``) for writes, with gateway
names, and never touch a cache tier or an origin client themselves. Bad input
is an S3 error (4xx, S3 XML, request id), never a 500.

What this package may import: the standard library, aiohttp,
``gateway.core.errors``, ``gateway.config.settings``, ``gateway.pieces``,
``gateway.origins.base`` (the values it renders), and the two services it
fronts, ``gateway.read.reader`` and ``gateway.write.writer``. Nothing the reader or
the writer uses imports it back; ``gateway.app.server`` mounts it, and the other
HTTP faces (``admin.py``, ``access.py``, ``prefetch/``, ``warm/``) reuse its
caller identity (``auth.Principal``) and its error rendering.

Not guaranteed: every S3 operation is answered here. Operations Hoard does
not implement itself are forwarded to an S3 origin as they came, and refused
(NotImplemented) by an origin that cannot take them (posix).
"""
