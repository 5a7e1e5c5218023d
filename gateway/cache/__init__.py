"""The block cache: immutable blocks of objects, in memory and on local disk.

An object is cached as fixed-size blocks (``cache.block_size``, 8 MiB by
default), each named by (origin, bucket, key, ETag, index) (``block.py``).
A block never changes meaning: a new version of an object has a new ETag, so
its blocks are new blocks and the old ones age out. Nothing here ever asks
whether a block is fresh; metadata decides that (``gateway/metadata/``).

The tiers, fastest first, each one concept:

- ``memory.py``: hot small blocks as bytes in this process, LRU.
- ``disk.py``: the disk tier, the node's working set on local disk, shared
  by the node's worker processes; it decides what runs when, in which
  thread, in which order. Beside it, storage split from index as in
  python-diskcache: ``disk_files.py`` (a block as a file: claim, seal,
  tail, open and verify), ``disk_index.py`` (the SQLite index, eviction; its
  tables and their layout in ``disk_schema.py``),
  ``disk_packed.py``, ``segment_files.py``, ``segment_kept.py`` and
  ``segment_sql.py`` (small blocks packed into segment files;
  ``segment_leases.py``, a record lent again through a read's ticket without
  its lookup), ``disk_claims.py`` (a fill's claim
  that asks the index), ``disk_open.py`` (hot descriptors kept open),
  ``disk_writer.py`` (one fill in progress), ``disk_pins.py`` (blocks warm
  jobs keep), ``disk_space.py`` (a file system that fills first),
  ``disk_recovery.py`` (after a crash), ``disk_removal.py`` (what leaves:
  rows first, files after).
- ``admission.py``: which misses are worth a disk write (the second one).
- ``singleflight.py``: concurrent fills of one block coalesced into one, its
  bytes streamed to every waiter as they arrive.

Which tier serves a read, and where a miss goes (owner node, origin), is
decided above this package, in ``gateway/blocks/``.

What this package may import: the standard library, ``gateway.core.tasks`` and
itself. It knows no origins, no HTTP, no S3, no cluster: a block is bytes and
a name.

Not guaranteed: a block survives anything. The cache is a cache: a lost,
torn or evicted block is a miss, fetched again; a corrupt one is detected by
its header and checksum when opened and dropped.
"""
