"""From an HTTP request line to (bucket, key, S3 operation).

Handles path-style (``/bucket/key``) and virtual-hosted-style
(``bucket.<domain>/key``, for each configured domain) addressing. The key is
percent-decoded from the raw path exactly once and never normalised: S3 keys
may contain ``//``, ``..`` or a trailing ``/`` and mean them literally.

Operations Hoard does not serve yet are still named, so metrics and errors
say which one was refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import unquote

from gateway.s3.errors import Code, S3Error

# Bucket sub-resources; GET on any of these other than ``location`` is not a listing.
_BUCKET_SUBRESOURCES = (
    "accelerate", "acl", "analytics", "cors", "encryption", "intelligent-tiering",
    "inventory", "lifecycle", "logging", "metrics", "notification", "object-lock",
    "ownershipControls", "policy", "policyStatus", "publicAccessBlock", "replication",
    "requestPayment", "tagging", "uploads", "versioning", "versions", "website",
)  # fmt: skip
_OBJECT_SUBRESOURCES = (
    "acl", "attributes", "legal-hold", "retention", "tagging", "torrent", "uploadId",
)  # fmt: skip

SUPPORTED = frozenset(
    {"ListBuckets", "HeadBucket", "GetBucketLocation", "ListObjects", "ListObjectsV2",
     "HeadObject", "GetObject"}
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Route:
    bucket: str
    key: str | None
    operation: str

    @property
    def supported(self) -> bool:
        return self.operation in SUPPORTED


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
    method: str, host: str, raw_path: str, query: dict[str, str], domains: list[str]
) -> Route:
    """Name the S3 operation a request asks for."""
    path = raw_path.split("?", 1)[0] or "/"
    virtual_bucket = split_host(host, domains)
    if virtual_bucket is not None:
        bucket, key = virtual_bucket, _decode(path[1:]) or None
    else:
        bucket_part, _, key_part = path[1:].partition("/")
        bucket, key = _decode(bucket_part), (_decode(key_part) or None)
    if not bucket:
        return Route("", None, _service_operation(method))
    if key is None:
        return Route(bucket, None, _bucket_operation(method, query))
    return Route(bucket, key, _object_operation(method, query))


def _service_operation(method: str) -> str:
    if method == "GET":
        return "ListBuckets"
    raise S3Error(Code.MethodNotAllowed)


def _bucket_operation(method: str, query: dict[str, str]) -> str:
    if method == "GET":
        if "location" in query:
            return "GetBucketLocation"
        for name in _BUCKET_SUBRESOURCES:
            if name in query:
                return f"GetBucket:{name}"
        return "ListObjectsV2" if query.get("list-type") == "2" else "ListObjects"
    if method == "HEAD":
        return "HeadBucket"
    if method == "PUT":
        return "CreateBucket" if not query else "PutBucketSubresource"
    if method == "DELETE":
        return "DeleteBucket" if not query else "DeleteBucketSubresource"
    if method == "POST":
        return "DeleteObjects" if "delete" in query else "PostObject"
    raise S3Error(Code.MethodNotAllowed)


def _object_operation(method: str, query: dict[str, str]) -> str:
    if method in ("GET", "HEAD"):
        verb = "Get" if method == "GET" else "Head"
        for name in _OBJECT_SUBRESOURCES:
            if name in query:
                return "ListParts" if name == "uploadId" else f"{verb}Object:{name}"
        if "partNumber" in query:
            return f"{verb}ObjectPart"
        if "versionId" in query:
            return f"{verb}ObjectVersion"
        return f"{verb}Object"
    if method == "PUT":
        return "UploadPart" if "uploadId" in query else "PutObject"
    if method == "DELETE":
        return "AbortMultipartUpload" if "uploadId" in query else "DeleteObject"
    if method == "POST":
        if "uploads" in query:
            return "CreateMultipartUpload"
        return "CompleteMultipartUpload" if "uploadId" in query else "PostObject"
    raise S3Error(Code.MethodNotAllowed)


def copy_source_bucket(value: str) -> str:
    """The bucket an ``x-amz-copy-source`` header (``[/]bucket/key[?versionId=v]``) reads from."""
    path = unquote(value.partition("?")[0], errors="replace")
    return path.removeprefix("/").partition("/")[0]
