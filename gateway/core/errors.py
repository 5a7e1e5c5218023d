"""Domain errors: what went wrong, in Hoard's terms, with no HTTP in sight.

Origins, the cache and the reader raise these; only ``s3/errors.py`` turns them
into S3 wire errors. Keeping the two apart lets an origin say "that key does
not exist" without knowing that S3 spells it ``NoSuchKey`` with a 404.
"""

from __future__ import annotations


class HoardError(Exception):
    """Base of every domain error. ``str(err)`` is a message fit for a client."""


class NotFound(HoardError):
    """Something named by the request does not exist."""


class NoSuchBucket(NotFound):
    def __init__(self, bucket: str) -> None:
        super().__init__(f"The specified bucket does not exist: {bucket}")
        self.bucket = bucket


class NoSuchKey(NotFound):
    """``headers``: what the origin's 404 said about the key, sent on with it
    (S3: ``x-amz-delete-marker`` and ``x-amz-version-id`` when the current
    version is a delete marker). ``age``: seconds since the origin said so (a
    sibling worker's answer, ``node/pages.py``), so a cache of it keeps its TTL."""

    def __init__(self, key: str, headers: dict[str, str] | None = None, age: float = 0.0) -> None:
        super().__init__("The specified key does not exist.")
        self.key = key
        self.headers = headers or {}
        self.age = age


class InvalidBucketName(HoardError):
    """A bucket name S3's naming rules do not allow (S3: 400)."""


class BucketAlreadyExists(HoardError):
    """The name is taken by something that is not a bucket of this caller (S3: 409)."""


class BucketNotEmpty(HoardError):
    """A bucket to delete still holds objects (S3: 409)."""


class InvalidObjectName(HoardError):
    """A key the origin cannot represent safely (e.g. a posix path escaping its root)."""


class AccessDenied(HoardError):
    """The origin or a mount policy refuses the operation."""


class PreconditionFailed(HoardError):
    """If-Match / If-Unmodified-Since did not hold (HTTP 412)."""

    def __init__(self, condition: str = "If-Match") -> None:
        super().__init__("At least one of the pre-conditions you specified did not hold")
        self.condition = condition


class NotModified(HoardError):
    """If-None-Match / If-Modified-Since matched: the client's copy is current (HTTP 304).

    ``etag`` and ``last_modified`` travel with it because a 304 still carries them.
    """

    def __init__(self, etag: str, last_modified: object) -> None:
        super().__init__("Not Modified")
        self.etag = etag
        self.last_modified = last_modified


class RangeNotSatisfiable(HoardError):
    def __init__(self, size: int) -> None:
        super().__init__("The requested range is not satisfiable")
        self.size = size


class OriginUnavailable(HoardError):
    """The origin could not be reached or kept failing after retries."""


class OriginThrottled(OriginUnavailable):
    """The origin said SlowDown (or 503) and retries ran out."""


class OriginChanged(HoardError):
    """The object changed at the origin while it was being read (ETag moved)."""


class NotImplementedByOrigin(HoardError):
    """The origin type cannot perform this operation."""


# -- multipart uploads (raised by origins that stage uploads themselves: posix) --


class NoSuchUpload(NotFound):
    """The upload id is unknown, finished, aborted, or belongs to another key (S3: 404)."""

    def __init__(self, upload_id: str) -> None:
        super().__init__("The specified upload does not exist.")
        self.upload_id = upload_id


class InvalidPart(HoardError):
    """A listed part was never uploaded, or its ETag does not match (S3: 400)."""


class InvalidPartOrder(HoardError):
    """The parts of a complete are not in strictly ascending order (S3: 400)."""


class EntityTooSmall(HoardError):
    """A part other than the last is under 5 MiB (S3: 400)."""


class InvalidArgument(HoardError):
    """An argument out of its range, e.g. a part number outside 1..10000 (S3: 400)."""


class MetadataTooLarge(HoardError):
    """The object's metadata does not fit where the origin keeps it (S3: 400)."""
