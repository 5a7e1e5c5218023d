"""Blocks: where the bytes of one block come from, and what a fill does.

``source.py`` (``BlockSource``) walks the tiers for one block: the memory
tier, the disk tier, the block's owner node in a cluster, the origin last;
misses of the same block are coalesced into one fill, whose bytes stream to
every waiter as they arrive. ``fill.py`` is what runs inside such a fill on
the node that owns the block: the disk re-checked, the block claimed (or a
sibling worker's claim followed), handed to the disk tier as it pours.

A block is named by its object's ETag (``gateway/cache/block.py``), so
nothing here asks whether bytes are fresh: metadata (``gateway/metadata/``)
decides which block a read wants.

What this package may import: ``gateway.cache``, ``gateway.cluster`` (the
owners of a block), ``gateway.origins``, ``gateway.pieces``, ``gateway.core``
and ``gateway.obs``. The read path, warm jobs and prefetch use it; it knows
none of them.
"""
