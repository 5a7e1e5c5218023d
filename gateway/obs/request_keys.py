"""What a request carries from where it is answered to where it is accounted.

aiohttp's request is a mapping for a handler's own notes. Keys of type
``web.RequestKey`` name each note with its type (string keys draw aiohttp's
``NotAppKeyWarning``). The server's middleware, the S3 front and the hit path
write them; ``server.account`` reads them for the metrics and the access log.
A hit answered on the wire carries them in its ``WireRequest``, a mapping too.
"""

from __future__ import annotations

from collections.abc import Mapping

from aiohttp import web

REQUEST_ID = web.RequestKey("request_id", str)  # the x-amz-request-id of the answer
OPERATION = web.RequestKey("operation", str)  # the S3 operation, "Admin" or "Peer"
BUCKET = web.RequestKey("bucket", str)  # the bucket in the client's terms
MOUNT = web.RequestKey("mount", str)  # the bucket's mount label, for the metrics
ERROR_CODE = web.RequestKey("error_code", str)  # the S3 error code of an error answer
SOURCE = web.RequestKey("source", str)  # the tiers that served the body, "+"-joined
SERVED = web.RequestKey("served", Mapping)  # bytes served, by tier (metrics.SOURCES)
CUT = web.RequestKey("cut", str)  # why a body was cut short, if it was
SENT = web.RequestKey("sent", int)  # the body bytes sent before a cut
CORS = web.RequestKey("cors", Mapping)  # the CORS headers of Hoard's own answer (s3/cors.py)
OBJECTS = web.RequestKey("objects", int)  # the keys a bundle asked for (BundleObjects)
CONTINUED = web.RequestKey("continued", bool)  # "100 Continue" was sent (Expect: 100-continue)
# The caller this request's signature was verified as (an ``auth.Principal``): a request the
# hit path admitted, then handed on, is not verified again (``S3Front.admit``).
PRINCIPAL = web.RequestKey("principal", object)
