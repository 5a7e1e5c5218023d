"""The directories of posix origins, looked at once before ``hoard serve`` starts.

A posix origin's mistakes do not show in the config's syntax, and at run time
they look like a working gateway with nothing in it: a ``path`` that does not
exist answered every request with 503, and a folder named ``My_Data`` or
``ab`` in a served directory (no valid bucket name) simply was not there
(``NoSuchBucket``, nothing logged). So, at start:

- a ``path`` that is missing, not a directory or unreadable is a config error
  naming the key and the path: refused (exit 2), not created, because a typo
  would otherwise start an empty gateway beside the real data (the embedded
  default creates its ``./data`` itself, before this check);
- a mount of a posix origin whose ``origin_bucket`` is no valid bucket name
  can never answer, and is a config error too;
- each top-level folder of the default origin's directory whose name is no
  bucket is named in a warning with the rule it breaks; names are printed with
  ``repr`` so a name with a newline cannot forge a log line. Hidden folders
  (a leading dot: ``.git``, Hoard's own ``.hoard-uploads``) are skipped quietly.

Not guaranteed: anything after start. A folder renamed or removed later is
seen (or missed) by requests, not reported; a directory that vanishes later
answers 503 as before.
"""

from __future__ import annotations

import os

from gateway.config.settings import PosixOriginConfig, Settings
from gateway.origins.posix_buckets import valid_bucket_name, why_not_a_bucket


def root_problems(settings: Settings) -> list[str]:
    """One config-error line per posix origin path or posix mount that cannot serve."""
    problems = []
    for name, origin in settings.origins.items():
        if isinstance(origin, PosixOriginConfig):
            why = _unusable(str(origin.path))
            if why:
                problems.append(f"origins.{name}.path: {_shown(str(origin.path))} {why}")
    for index, mount in enumerate(settings.mounts):
        posix = isinstance(settings.origins.get(mount.origin), PosixOriginConfig)
        if posix and mount.origin_bucket and not valid_bucket_name(mount.origin_bucket):
            problems.append(
                f"mounts.{index}.origin_bucket: {mount.origin_bucket!r} "
                f"{why_not_a_bucket(mount.origin_bucket)}, so it names no bucket folder"
            )
    return problems


def skipped_folders(settings: Settings) -> list[str]:
    """One warning line per folder at the top of the default posix origin that is no bucket."""
    origin = settings.origins.get(settings.default_origin or "")
    if not isinstance(origin, PosixOriginConfig):
        return []
    root = str(origin.path)
    try:
        with os.scandir(root) as entries:
            folders = sorted(e.name for e in entries if e.is_dir() and not e.name.startswith("."))
    except OSError:
        return []  # root_problems has said why
    return [
        f"folder {name!r} in {_shown(root)} is not served: its name {why_not_a_bucket(name)} "
        "(S3 bucket names are 3-63 lowercase letters, digits, '.' and '-'); rename it to serve it"
        for name in folders
        if not valid_bucket_name(name)
    ]


def _unusable(path: str) -> str | None:
    """Why ``path`` cannot be a posix origin's root, or None."""
    try:
        with os.scandir(path):
            return None
    except FileNotFoundError:
        return "does not exist (create it, or fix the path)"
    except NotADirectoryError:
        return "is not a directory"
    except OSError as err:
        return f"cannot be read: {err.strerror}"


def _shown(path: str) -> str:
    """The path as configured, with where a relative one lands (it is relative to the cwd)."""
    absolute = os.path.abspath(path)
    return repr(path) if absolute == path else f"{path!r} ({absolute!r})"
