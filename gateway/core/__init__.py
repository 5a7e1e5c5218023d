"""The core: values and rules every layer shares, and nothing that decides.

What lives here is small and has no opinion about caching: the domain errors
(``errors.py``: what went wrong in Hoard's terms, no HTTP in sight), what a
write makes stale (``invalidation.py``), who waits for an origin request
(``priority.py``), a byte range as a client asked it (``ranges.py``),
background tasks kept and stopped together (``tasks.py``), SQLite shared by a
node's workers (``sqlite_wal.py``, ``sqlite_loop.py``), a file every worker
maps (``mapped.py``), the SigV4 signing key (``sigv4_key.py``), the TLS
contexts (``tls.py``), log records escaped to stay one line each
(``logtext.py``), plain request heads split and parsed off the wire for the
hit path (``heads.py``, with its compiled twin ``_heads.pyx``), and which
twins run (``compiled.py``).

What this package may import: the standard library, third-party libraries
and ``gateway.config`` (``tls.py`` reports an unusable certificate as a
``ConfigError``). Everything else imports it; it imports nothing above it.
"""
