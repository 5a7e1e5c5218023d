"""The write path: a mutation sent to its origin, then everything it touched forgotten.

``writer.py`` (``Writer``) forwards a write to an S3 origin or performs it on
a writable origin (a directory), then invalidates what it made stale through
``gateway/coherence/`` before the client has its answer, and tells the
cluster's other nodes. ``through.py`` is write-through: an upload's bytes,
teed as they stream by (``capture.py``, within one budget per process), are
cached once the origin has acknowledged them, unless a later change overtook
them (a watch on the key, ``gateway/coherence/watch.py``).

What this package may import: ``gateway.coherence``, ``gateway.metadata``,
``gateway.blocks``, ``gateway.cache``, ``gateway.origins``, ``gateway.core``.
Never ``gateway.read``: a PUT passes through nothing of the read path.
"""
