"""Object and listing metadata: what the origin said about objects, and how it stays true.

Training sets are millions of small objects read once per epoch, in epochs
that outlast any TTL. Asking the origin about each object once per TTL (a HEAD
per key) is the thundering herd Hoard exists to prevent, so metadata that
expires is revalidated in bulk: one listing of the object's directory answers
for up to 1,000 keys per origin page (``revalidate.py``).

The tiers, fastest first:
  * ``memory.py``: each worker's memory (heads and whole listings, TTLs,
    stale-while-revalidate, coalesced misses; its values, policies and
    listings' LRU in ``lookups.py``, serving by age and one flight per key in
    ``freshness.py``);
  * ``store.py``: the node's SQLite store, shared by workers and kept across
    restarts;
  * ``cluster/directory.py``: in a cluster, the key's (or prefix's) owner node;
  * the origin.
``journal.py`` carries every invalidation to every worker of the node: a
shared memory-mapped ring each worker reads before trusting a stored row.
``bucket_config.py`` holds what the origin says of a bucket as a whole (its
CORS rules) for the mount's TTL, one flight per bucket, forgotten by any
bucket-level invalidation.

``source.py`` walks these tiers for the reader (``MetadataSource``): the
reader says what a miss may cost at the call site (a HEAD, or the read's own
first-block GET), and gets one answer. ``codec.py`` is the one JSON codec of
metadata that leaves a process (store rows, peer answers).

What this package may import: the leaves (``gateway.core.errors``,
``gateway.core.invalidation``, ``gateway.origins.base`` and ``origins.listing``,
``gateway.cache.singleflight`` (the one coalescing primitive: flights here are a ``Group``),
``gateway.origins.namespace``'s ``Mount``), the cluster's wire value type
and itself. ``query.py`` is the question one node asks a key's owner
(``MetadataQuery``), whose URL form is the cluster's wire. Nothing here imports the
reader, the blocks or the cluster: the owner node is a protocol
(``source.OwnerNode``) that ``cluster/directory.py`` implements, with a
single-node null object (``source.NoOwner``).

Memory is bounded in bytes and sized for millions of objects: a HEAD answer is
one packed record (``heads.py``, ~214 bytes an object; what a dataset's
answers share, stored headers included, is one interned shape, ``shapes.py``),
a prefix's whole listing one columnar snapshot (``snapshot.py``, ~85 bytes a
key) that pages without building an object per key. A cold listing answers
the pages its walk has already settled (``walk.py``); a cached one renders
each page once per snapshot and serves the bytes after (``bodies.py``).

Age travels with an answer across tiers: an entry served from the store or
confirmed by a listing is as old as that answer, never refreshed by being
copied, so what a client sees as fresh is at most ``metadata_ttl`` old (in a
cluster, an owner's listing may add up to its own TTL: see ``revalidate.py``).
"""
