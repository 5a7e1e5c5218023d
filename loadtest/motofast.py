"""moto's plain PUTs and GETs of the capacity workload's wide set, without moto's dispatch.

The ``small 4k wide`` phase (``wrkload.py``) needs tens of thousands of 4 KiB
objects seeded once and read once by each target before its warm hits are
measured. moto spends several milliseconds of CPU on each such request in its
dispatch (Flask, a backend looked up by host, the response class set up anew),
not in the object: 50,000 of them cost minutes of seeding and minutes of
cold reads per target. Here a request for a key under ``WIDE`` that is a plain
PUT or GET is answered from moto's own backend, with what moto's
``put_object`` / ``get_object`` do for it:

- PUT (no query, no copy, lock, ACL, tagging, encryption or storage-class
  header; a plain body): ``backend.put_object`` with the checksum the request
  names, then the metadata moto takes from the headers and the bucket's ACL.
- GET (a query of signature arguments only, no conditional or ``Origin``
  header, no range or one plain ``bytes=a-b`` / ``bytes=a-`` within the
  object): the key's own headers (``response_dict``, metadata), its checksum
  when ``x-amz-checksum-mode: ENABLED`` asks (dropped for a part, as moto
  does), ``Accept-Ranges``, moto's request id and the global CORS header.

Anything else, a missing key included, goes to moto as before. Keys outside
``WIDE`` never take this path, so every other workload's origin is unchanged.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

from moto.core import DEFAULT_ACCOUNT_ID
from moto.moto_server import werkzeug_app
from moto.s3.models import s3_backends
from moto.s3.utils import metadata_from_headers
from moto.utilities.aws_headers import gen_amzn_requestid_long

from loadtest.datasets import WIDE

_SIGNATURE_ARG = re.compile(r"(?i)(x-amz-[a-z0-9-]+|x-id|awsaccesskeyid|signature|expires)")
_RANGE = re.compile(r"bytes=(\d+)-(\d*)")
# A PUT carrying any of these is not a plain one (moto's put_object reads them).
_PUT_OTHER = ("HTTP_X_AMZ_COPY_SOURCE", "HTTP_X_AMZ_OBJECT_LOCK_MODE",
              "HTTP_X_AMZ_OBJECT_LOCK_RETAIN_UNTIL_DATE", "HTTP_X_AMZ_OBJECT_LOCK_LEGAL_HOLD",
              "HTTP_X_AMZ_ACL", "HTTP_X_AMZ_GRANT_READ", "HTTP_X_AMZ_GRANT_FULL_CONTROL",
              "HTTP_X_AMZ_TAGGING", "HTTP_X_AMZ_SERVER_SIDE_ENCRYPTION",
              "HTTP_X_AMZ_STORAGE_CLASS", "HTTP_CONTENT_ENCODING", "HTTP_IF_MATCH",
              "HTTP_IF_NONE_MATCH", "HTTP_X_AMZ_DECODED_CONTENT_LENGTH")  # fmt: skip
_GET_OTHER = ("HTTP_IF_MATCH", "HTTP_IF_NONE_MATCH", "HTTP_IF_MODIFIED_SINCE",
              "HTTP_IF_UNMODIFIED_SINCE", "HTTP_ORIGIN", "HTTP_X_AMZ_SERVER_SIDE_ENCRYPTION_CUSTOMER_ALGORITHM")  # fmt: skip
_STATUS = {200: "200 OK", 206: "206 Partial Content"}
Answer = tuple[int, dict[str, str], bytes]


def _backend(bucket: str) -> Any:
    account = s3_backends.bucket_accounts.get(bucket, DEFAULT_ACCOUNT_ID)
    return s3_backends[account]["aws"]


def _headers(environ: dict[str, Any]) -> dict[str, str]:
    """The request's headers as moto's request object names them (``X-Amz-Foo``)."""
    headers = {
        name[5:].replace("_", "-").title(): value
        for name, value in environ.items()
        if name.startswith("HTTP_")
    }
    if environ.get("CONTENT_TYPE"):
        headers["Content-Type"] = environ["CONTENT_TYPE"]
    return headers


def _put(environ: dict[str, Any], bucket: str, key: str) -> Answer | None:
    if environ.get("QUERY_STRING") or any(h in environ for h in _PUT_OTHER):
        return None
    length = int(environ.get("CONTENT_LENGTH") or 0)
    body = environ["wsgi.input"].read(length) if length else b""
    backend = _backend(bucket)
    algorithm = environ.get("HTTP_X_AMZ_SDK_CHECKSUM_ALGORITHM", "")
    value = environ.get(f"HTTP_X_AMZ_CHECKSUM_{algorithm.upper()}") if algorithm else None
    if algorithm and not value:
        return None  # moto would compute it (or read a trailer): its own path
    new = backend.put_object(bucket, key, body, checksum_value=value)
    new.set_metadata(metadata_from_headers(_headers(environ)))
    new.set_acl(backend.get_bucket(bucket).acl)
    if algorithm:
        new.checksum_algorithm = algorithm
    backend.put_object_tagging(new, {})
    headers = dict(new.response_dict)
    headers.pop("content-length", None)
    if value:
        headers[f"x-amz-checksum-{algorithm.lower()}"] = value
    return 200, headers, b""


def _get(environ: dict[str, Any], bucket: str, key: str) -> Answer | None:
    query = environ.get("QUERY_STRING", "")
    if any(not _SIGNATURE_ARG.fullmatch(p.partition("=")[0]) for p in query.split("&") if p):
        return None
    if any(h in environ for h in _GET_OTHER):
        return None
    found = _backend(bucket).get_object(bucket, key)
    if found is None or found.storage_class != "STANDARD":
        return None
    headers: dict[str, str] = {}
    if found.version_id != "null":
        headers["x-amz-version-id"] = found.version_id
    headers.update(found.response_dict)
    if environ.get("HTTP_X_AMZ_CHECKSUM_MODE") == "ENABLED" and found.checksum_algorithm:
        if found.checksum_type == "COMPOSITE":
            return None
        headers[f"x-amz-checksum-{found.checksum_algorithm.lower()}"] = found.checksum_value
        if found.checksum_type:
            headers["x-amz-checksum-type"] = found.checksum_type
    headers.update(found.metadata)
    headers["Accept-Ranges"] = "bytes"
    body = found.value
    wanted = environ.get("HTTP_RANGE")
    if wanted is None:
        return 200, headers, bytes(body)
    match = _RANGE.fullmatch(wanted.strip())
    last = found.size - 1
    if not match or int(match.group(1)) > last:
        return None  # not plain, or moto's 416
    begin = int(match.group(1))
    end = min(int(match.group(2)), last) if match.group(2) else last
    if begin > end:
        return 200, headers, bytes(body)
    if begin or end < last:
        for name in [h for h in headers if h.startswith("x-amz-checksum-")]:
            del headers[name]
    headers["content-range"] = f"bytes {begin}-{end}/{found.size}"
    headers.pop("content-length", None)
    return 206, headers, bytes(body[begin : end + 1])


def _answer(environ: dict[str, Any]) -> Answer | None:
    bucket, _, key = environ.get("PATH_INFO", "").lstrip("/").partition("/")
    if not key.startswith(WIDE):
        return None
    method = environ.get("REQUEST_METHOD")
    if method == "PUT":
        return _put(environ, bucket, key)
    return _get(environ, bucket, key) if method == "GET" else None


def install() -> None:
    """Answer plain PUTs and GETs of wide keys before moto's dispatcher sees them."""
    dispatch = werkzeug_app.DomainDispatcherApplication.__call__

    def call(self: Any, environ: dict[str, Any], start: Callable[..., Any]) -> Iterable[bytes]:
        answer = _answer(environ)
        if answer is None:
            return dispatch(self, environ, start)
        status, headers, body = answer
        gen_amzn_requestid_long(headers)
        headers["Access-Control-Allow-Origin"] = "*"  # flask_cors, on every moto answer
        headers["Content-Length"] = str(len(body))
        start(_STATUS[status], list(headers.items()))
        return [body]

    werkzeug_app.DomainDispatcherApplication.__call__ = call  # type: ignore[method-assign]
