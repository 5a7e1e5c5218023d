"""The read path: a bucket and a key in, metadata and bytes out.

``reader.py`` (``Reader``) is the orchestrator, as groupcache.go is: the
namespace resolves the bucket to a mount and an origin key, the metadata
tiers (``gateway/metadata/``) answer what the object is, the block plan cuts
the asked range into blocks, and the block source (``gateway/blocks/``)
yields their bytes. A cold object's metadata is learned from the first block
the client needs (``first_block.py``: one origin round trip, not two).
``object_read.py`` is one object being read (its metadata, then its
pieces), ``readahead.py`` how far ahead of a sequential reader to fetch,
``manifests.py`` a small object read whole (a list of keys to come), and
``tickets.py`` a hit's lookups kept per key while they hold (the hit path
asks the same questions of a warm key on every read).

The reader does not build what it uses: the metadata source, the
invalidator and the block source come from the wiring. It never writes:
writes and write-throughs are ``gateway/write/``'s.

What this package may import: ``gateway.blocks``, ``gateway.coherence``,
``gateway.metadata``, ``gateway.cache`` (block names and plans),
``gateway.origins``, ``gateway.pieces``, ``gateway.obs``, ``gateway.core``.
Never ``gateway.s3``, ``gateway.cluster`` or ``gateway.write``.
"""
