"""Safe defaults at start-up: no weak secret on a port other hosts can reach.

A secret guards everything a key may do (read every bucket it names, through
Hoard's own origin credentials), and the cluster secret guards the peer
endpoints (any block, any metadata, invalidations). A secret that is empty,
short enough to guess, or one of the placeholders this repository ships in its
example configs, Compose file and Kubernetes Secret, is no guard at all. Hoard
therefore refuses to start with one, naming the key, unless it listens on a
loopback address only: there a developer's ``change-me`` harms nobody else, and
gets a loud warning instead.

Cached objects are as private as the origin keeps them: ``cache.umask`` (077
by default) is the process umask, so block files, the metadata store and job
files are 0600 in 0700 directories, and a cache directory left open by an
older version is closed at start. It applies to every file the process
creates, objects written to a posix origin included; a shared cache (or a
posix origin read by others) sets 027 or 022.

Not guaranteed: that a long secret is a random one. The check catches the
mistakes seen in practice (an unset variable expanding to "", a template
value never replaced), not a weak choice.
"""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path

from gateway.config.settings import S3OriginConfig, Settings, split_listen

MIN_SECRET_LENGTH = 16
# Values shipped as examples in config/, docker-compose.yml and deploy/: never real.
PLACEHOLDERS = frozenset({
    "change-me", "changeme", "change-me-trainer-secret", "change-me-cluster-secret",
    "trainer-secret", "compose-cluster-secret", "secret", "password",
})  # fmt: skip


def weakness(secret: str) -> str | None:
    """Why ``secret`` is unfit to guard a reachable port, or None."""
    if not secret.strip():
        return "is empty or whitespace"
    if secret.lower() in PLACEHOLDERS or secret.lower().startswith("change-me"):
        return "is a placeholder shipped with Hoard's examples"
    if len(secret) < MIN_SECRET_LENGTH:
        return f"is shorter than {MIN_SECRET_LENGTH} characters"
    return None


def weak_secrets(settings: Settings) -> list[str]:
    """One line per weak secret, naming its key (never showing the secret)."""
    problems = []
    for index, credential in enumerate(settings.credentials):
        why = weakness(credential.secret_key.get_secret_value())
        if why:
            problems.append(f"credentials.{index}.secret_key ({credential.access_key!r}) {why}")
    cluster = settings.cluster
    if cluster.enabled and cluster.secret is not None:
        why = weakness(cluster.secret.get_secret_value())
        if why:
            problems.append(f"cluster.secret {why}")
    return problems


def ambient_origins(settings: Settings) -> list[str]:
    """One line per S3 origin that signs with the host's ambient AWS credentials.

    Not an error (an instance role is the usual way on AWS), but worth saying at
    start: every key Hoard accepts reaches whatever those credentials can, within
    its ``buckets``/``readonly`` limits, and the shipped example forwards to AWS.
    """
    return [
        f"origin {name!r} signs with the host's ambient AWS credentials (no access_key "
        "configured): every accepted key reaches what they can, within its buckets and "
        "readonly limits"
        for name, origin in settings.origins.items()
        if isinstance(origin, S3OriginConfig) and origin.access_key is None
    ]


def is_loopback(listen: str) -> bool:
    """Whether ``listen`` (host:port) is reachable from this host only."""
    host, _ = split_listen(listen)
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything


def refusals(settings: Settings) -> tuple[list[str], list[str]]:
    """(refused, warned): weak secrets are refused off loopback and only warned about on it."""
    problems = weak_secrets(settings)
    if not problems:
        return [], []
    advice = (" - use a random secret of 16 or more characters from the environment "
              "(e.g. `openssl rand -hex 32`)")  # fmt: skip
    lines = [problem + advice for problem in problems]
    return ([], lines) if is_loopback(settings.listen) else (lines, [])


def private_cache(cache_dir: Path, umask: int) -> None:
    """Apply ``cache.umask`` to everything this process creates; tighten the cache dir.

    A cache made by an older Hoard (0755) is closed too: what lies inside is
    reachable only through the directory.
    """
    os.umask(umask)
    cache_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(cache_dir, 0o777 & ~umask)
