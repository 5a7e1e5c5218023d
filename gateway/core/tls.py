"""HTTPS: the server's certificate (reloaded on SIGHUP) and the trust peers are checked with.

With ``tls.cert`` and ``tls.key`` (PEM files) the listen address speaks HTTPS
only. One ``ssl.SSLContext`` per worker holds the certificate; a SIGHUP loads
the files again into that same context, so a renewed certificate (say from
cert-manager) is served to every new connection without a restart, and
connections already open keep the one they began with. A reload that fails (a
half-written file, a key that does not match) is logged and the old
certificate stays: a rotation mistake must not take the node down.

Peers are reached at the URLs in ``cluster.peers``/``cluster.self``; an
``https://`` URL is verified against the system's trust store, or only against
``cluster.ca_bundle`` when it is set (a private CA for the cluster's own
certificates). The same context serves block reads, metadata and probes.

Not guaranteed: a certificate for the names clients use (``127.0.0.1``,
``hoard.ml-cache``...): that is the certificate's business, and clients check it.
"""

from __future__ import annotations

import logging
import ssl
from pathlib import Path

from gateway.config.settings import ConfigError

log = logging.getLogger(__name__)


def server_context(cert: Path, key: Path) -> ssl.SSLContext:
    """A server context holding ``cert``/``key``; ``ConfigError`` if they are unusable."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(cert, key)
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(f"tls: cannot load {cert} and {key}: {exc}") from None
    return context


def reload(context: ssl.SSLContext, cert: Path, key: Path) -> None:
    """Load ``cert``/``key`` again into ``context`` (SIGHUP); on failure keep the old ones."""
    try:
        context.load_cert_chain(cert, key)
    except (ssl.SSLError, OSError) as exc:
        log.error("TLS certificate reload failed, the old one stays: %s", exc)
        return
    log.info("TLS certificate reloaded from %s", cert)


def client_context(ca_bundle: Path | None) -> ssl.SSLContext:
    """How this node checks the peers it calls over https://."""
    return ssl.create_default_context(cafile=str(ca_bundle) if ca_bundle else None)
