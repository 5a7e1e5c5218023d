"""Buckets of a posix origin: CreateBucket makes a top-level directory, DeleteBucket removes one.

A bucket is a directory of the root whose name follows S3's naming rules
(``valid_bucket_name``); a directory whose name breaks them is no bucket, and
``hoard serve`` names each such folder at start with the rule it breaks
(``why_not_a_bucket``, ``gateway/app/posix_roots.py``). Creating one is one ``mkdir``; a name that is
already a bucket is no error (S3 in us-east-1 answers the owner 200), a name
taken by a file is ``BucketAlreadyExists``. Deleting one removes it and the
empty directories below it, which S3 would not even show; a file anywhere
below (an object, a write in progress, a crashed write's leftover temp file)
or a symlink makes it ``BucketNotEmpty``, as do files that arrive during the
removal (``rmdir`` refuses a directory that is not empty, so nothing is lost).

Not guaranteed: a bucket whose directory is itself a symlink is not deleted
(AccessDenied): the link, not the tree it points to, is what the root holds.
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Callable

from gateway.core import errors

_BUCKET_RE = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_IPV4_RE = re.compile(r"[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+")
_BAD_CHAR = re.compile(r"[^a-z0-9.-]")
# Resolves a bucket name to its real directory, or raises NoSuchBucket.
BucketDir = Callable[[str], str]


def valid_bucket_name(name: str) -> bool:
    """S3's rules: 3-63 of ``a-z0-9.-``, alphanumeric ends, no ``..``, not an IPv4 address."""
    return bool(_BUCKET_RE.fullmatch(name)) and ".." not in name and not _IPV4_RE.fullmatch(name)


def why_not_a_bucket(name: str) -> str | None:
    """Which of S3's naming rules ``name`` breaks (None: it is a valid bucket name).

    For messages only (a folder that is no bucket, named at start); requests
    ask ``valid_bucket_name``, which this agrees with.
    """
    if valid_bucket_name(name):
        return None
    if not 3 <= len(name) <= 63:
        return f"has {len(name)} characters, not 3 to 63"
    if _BAD_CHAR.search(name):
        return "has characters other than lowercase letters, digits, '.' and '-'"
    if ".." in name:
        return "has two dots in a row"
    if _IPV4_RE.fullmatch(name):
        return "is an IPv4 address"
    return "does not start and end with a lowercase letter or digit"


def create(root: str, bucket: str, bucket_dir: BucketDir) -> bool:
    """Make ``bucket``'s directory under ``root``; False if the bucket was already there."""
    if not valid_bucket_name(bucket):
        raise errors.InvalidBucketName(f"The specified bucket is not valid: {bucket}")
    try:
        os.mkdir(os.path.join(root, bucket), 0o755)
    except FileExistsError:
        try:
            bucket_dir(bucket)
        except errors.NoSuchBucket:
            raise errors.BucketAlreadyExists(f"{bucket} exists and is not a bucket") from None
        return False
    except PermissionError as err:
        raise errors.AccessDenied(f"The posix origin may not create {bucket}") from err
    except OSError as err:
        raise errors.OriginUnavailable(f"posix origin: {err.strerror}") from err
    return True


def delete(root: str, bucket: str, bucket_dir: BucketDir) -> None:
    """Remove the empty ``bucket`` (see the module docstring)."""
    path = bucket_dir(bucket)
    if os.path.islink(os.path.join(root, bucket)):
        raise errors.AccessDenied(f"{bucket} is a symlink; it is not deleted through Hoard")
    walked = list(os.walk(path, topdown=False))  # deepest first
    for folder, dirs, files in walked:
        if files or any(os.path.islink(os.path.join(folder, d)) for d in dirs):
            raise errors.BucketNotEmpty(f"The bucket you tried to delete is not empty: {bucket}")
    try:
        for folder, _, _ in walked:
            os.rmdir(folder)
    except OSError as err:
        if err.errno in (errno.ENOTEMPTY, errno.EEXIST):  # a file arrived meanwhile
            raise errors.BucketNotEmpty(
                f"The bucket you tried to delete is not empty: {bucket}"
            ) from err
        if err.errno in (errno.EACCES, errno.EPERM):
            raise errors.AccessDenied(f"The posix origin may not delete {bucket}") from err
        raise errors.OriginUnavailable(f"posix origin: {err.strerror}") from err
