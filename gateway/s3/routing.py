"""From an HTTP request line to (bucket, key, S3 operation).

Handles path-style (``/bucket/key``) and virtual-hosted-style
(``bucket.<domain>/key``, for each configured domain) addressing. The key is
percent-decoded from the raw path exactly once and never normalised: S3 keys
may contain ``//``, ``..`` or a trailing ``/`` and mean them literally.

Every request is named by its S3 operation (``GetObjectAcl``,
``PutBucketTagging``, ``CopyObject``...) from the one table below, whether Hoard
answers it or forwards it, so metrics and the access log say what it was.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import unquote

from gateway.s3.errors import Code, S3Error


def _named(resource: str) -> dict[str, str]:
    """``Get<r>``, ``Put<r>``, ``Delete<r>`` for GET, PUT, DELETE."""
    return {"GET": f"Get{resource}", "PUT": f"Put{resource}", "DELETE": f"Delete{resource}"}


def _configuration(resource: str) -> dict[str, str]:
    """``Get/Put/Delete<r>Configuration``; without an ``id`` a GET lists them."""
    return {m: f"{name}Configuration" for m, name in _named(resource).items()}


# Configurations kept by id: a GET without one is List<...>Configurations.
_LISTED_WITHOUT_ID = ("analytics", "intelligent-tiering", "inventory", "metrics")


# The one table of S3 operation names: what metrics, the access log and dispatch call a
# request. Per sub-resource of the query, the operation of each method (S3 API Reference
# names); the first sub-resource of the table that a query names decides.
_BUCKET_SUBRESOURCES: dict[str, dict[str, str]] = {
    "location": {"GET": "GetBucketLocation"},
    "uploads": {"GET": "ListMultipartUploads"},
    "versions": {"GET": "ListObjectVersions"},
    "delete": {"POST": "DeleteObjects"},
    "bundle": {"POST": "BundleObjects"},  # Tigris's batch GET: a TAR of many keys
    "accelerate": {"GET": "GetBucketAccelerateConfiguration", "PUT": "PutBucketAccelerateConfiguration"},
    "acl": {"GET": "GetBucketAcl", "PUT": "PutBucketAcl"},
    "analytics": _configuration("BucketAnalytics"),
    "cors": {"GET": "GetBucketCors", "PUT": "PutBucketCors", "DELETE": "DeleteBucketCors"},
    "encryption": {"GET": "GetBucketEncryption", "PUT": "PutBucketEncryption",
                   "DELETE": "DeleteBucketEncryption"},
    "intelligent-tiering": _configuration("BucketIntelligentTiering"),
    "inventory": _configuration("BucketInventory"),
    "lifecycle": {"GET": "GetBucketLifecycleConfiguration", "PUT": "PutBucketLifecycleConfiguration",
                  "DELETE": "DeleteBucketLifecycle"},
    "logging": {"GET": "GetBucketLogging", "PUT": "PutBucketLogging"},
    "metrics": _configuration("BucketMetrics"),
    "notification": {"GET": "GetBucketNotificationConfiguration",
                     "PUT": "PutBucketNotificationConfiguration"},
    "object-lock": {"GET": "GetObjectLockConfiguration", "PUT": "PutObjectLockConfiguration"},
    "ownershipControls": _named("BucketOwnershipControls"),
    "policy": _named("BucketPolicy"),
    "policyStatus": {"GET": "GetBucketPolicyStatus"},
    "publicAccessBlock": _named("PublicAccessBlock"),
    "replication": _named("BucketReplication"),
    "requestPayment": {"GET": "GetBucketRequestPayment", "PUT": "PutBucketRequestPayment"},
    "tagging": _named("BucketTagging"),
    "versioning": {"GET": "GetBucketVersioning", "PUT": "PutBucketVersioning"},
    "website": _named("BucketWebsite"),
}  # fmt: skip
_BUCKET = {"GET": "ListObjects", "HEAD": "HeadBucket", "PUT": "CreateBucket",
           "DELETE": "DeleteBucket", "POST": "PostObject", "OPTIONS": "PreflightRequest"}  # fmt: skip
_OBJECT_SUBRESOURCES: dict[str, dict[str, str]] = {
    "uploads": {"POST": "CreateMultipartUpload"},
    "acl": {"GET": "GetObjectAcl", "PUT": "PutObjectAcl"},
    "attributes": {"GET": "GetObjectAttributes"},
    "legal-hold": {"GET": "GetObjectLegalHold", "PUT": "PutObjectLegalHold"},
    "retention": {"GET": "GetObjectRetention", "PUT": "PutObjectRetention"},
    "tagging": _named("ObjectTagging"),
    "torrent": {"GET": "GetObjectTorrent"},
    "restore": {"POST": "RestoreObject"},
    "select": {"POST": "SelectObjectContent"},
    "uploadId": {"GET": "ListParts", "PUT": "UploadPart", "POST": "CompleteMultipartUpload",
                 "DELETE": "AbortMultipartUpload"},
}  # fmt: skip
_OBJECT = {"GET": "GetObject", "HEAD": "HeadObject", "PUT": "PutObject",
           "DELETE": "DeleteObject", "POST": "PostObject", "OPTIONS": "PreflightRequest"}  # fmt: skip
# With x-amz-copy-source, a PUT copies: the S3 name of what it is then.
_COPIES = {"PutObject": "CopyObject", "UploadPart": "UploadPartCopy"}
# Query parameters that make a GET/HEAD of an object something the cache does not hold.
_NOT_CACHED = frozenset(("partNumber", "versionId"))
# What Hoard answers itself; every other operation goes to the origin.
SERVED = frozenset({"ListBuckets", "HeadBucket", "GetBucketLocation", "ListObjects",
                    "ListObjectsV2", "HeadObject", "GetObject", "BundleObjects"})  # fmt: skip
# Operations named by a sub-resource that Hoard answers all the same.
_SERVED_NAMED = frozenset({"GetBucketLocation", "BundleObjects"})
# What reads although its method is one that writes: a bundle POSTs its key list.
READS = frozenset({"BundleObjects"})


@dataclass(frozen=True, slots=True)
class Route:
    """``operation`` is the S3 name; ``served``: Hoard answers it from its cache."""

    bucket: str
    key: str | None
    operation: str
    served: bool = False


def split_host(host: str, domains: list[str]) -> str | None:
    """The bucket named by a virtual-hosted ``Host`` header, if any."""
    hostname = host.lower()
    if hostname.startswith("["):
        return None  # an IPv6 literal never carries a bucket
    hostname = hostname.rsplit(":", 1)[0]
    for domain in domains:
        suffix = "." + domain.lower()
        if hostname.endswith(suffix) and len(hostname) > len(suffix):
            return hostname[: -len(suffix)]
    return None


def _decode(path: str) -> str:
    try:
        return unquote(path, errors="strict")
    except UnicodeDecodeError:
        raise S3Error(Code.InvalidArgument, "The request path is not valid UTF-8.") from None


def route(
    method: str,
    host: str,
    raw_path: str,
    query: dict[str, str],
    domains: list[str],
    copy_source: bool = False,
) -> Route:
    """Name the S3 operation a request asks for; ``copy_source``: it has x-amz-copy-source."""
    path = raw_path.split("?", 1)[0] or "/"
    virtual_bucket = split_host(host, domains)
    if virtual_bucket is not None:
        bucket, key = virtual_bucket, _decode(path[1:]) or None
    else:
        bucket_part, _, key_part = path[1:].partition("/")
        bucket, key = _decode(bucket_part), (_decode(key_part) or None)
    if not bucket:
        if method != "GET":
            raise S3Error(Code.MethodNotAllowed)
        return Route("", None, "ListBuckets", served=True)
    if key is None:
        operation, named = _bucket_operation(method, query)
    else:
        operation, named = _operation(method, query, _OBJECT_SUBRESOURCES, _OBJECT)
        if copy_source and method == "PUT":
            operation = _COPIES.get(operation, operation)
    plain = _NOT_CACHED.isdisjoint(query)
    served = operation in SERVED and plain and (not named or operation in _SERVED_NAMED)
    return Route(bucket, key, operation, served)


def _operation(
    method: str, query: dict[str, str], table: dict[str, dict[str, str]], plain: dict[str, str]
) -> tuple[str, bool]:
    """(the S3 name, whether a sub-resource was named). A sub-resource with no operation
    for this method is the origin's to answer, under the method's plain name."""
    if method not in plain:
        raise S3Error(Code.MethodNotAllowed)
    if table.keys().isdisjoint(query):  # a plain read (one set operation, not a loop)
        return plain[method], False
    for name, by_method in table.items():
        if name in query:
            return by_method.get(method, plain[method]), True
    return plain[method], False


def _bucket_operation(method: str, query: dict[str, str]) -> tuple[str, bool]:
    operation, named = _operation(method, query, _BUCKET_SUBRESOURCES, _BUCKET)
    if operation == "ListObjects" and query.get("list-type") == "2":
        return "ListObjectsV2", named
    if method == "GET" and "id" not in query and any(n in query for n in _LISTED_WITHOUT_ID):
        return "List" + operation.removeprefix("Get") + "s", named
    return operation, named


def copy_source_bucket(value: str) -> str:
    """The bucket an ``x-amz-copy-source`` header (``[/]bucket/key[?versionId=v]``) reads from."""
    path = unquote(value.partition("?")[0], errors="replace")
    return path.removeprefix("/").partition("/")[0]
