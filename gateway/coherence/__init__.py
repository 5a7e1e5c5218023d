"""Coherence: a change reaches every place on this node before a write is answered.

S3's rule is Hoard's: a write acknowledged by any worker of any node is seen
by every request that starts after it. ``invalidator.py`` names every place
a change of a key (or a prefix) reaches: this worker's metadata, the sibling
workers (the node's journal, applied by ``catch_up`` as each read starts),
the node's metadata store, the key's blocks, and the write-throughs under way
for it, which it tells through ``watch.py``'s registry of watched keys.

The reader and the writer are siblings over this package: the writer
invalidates through it, the reader catches up through it, and neither reaches
the other. The wiring builds it before both.

What this package may import: ``gateway.metadata``, ``gateway.blocks``,
``gateway.origins`` (the namespace), ``gateway.core``.
"""
