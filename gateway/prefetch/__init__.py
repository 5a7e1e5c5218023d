"""Epoch-order prefetch: fetch what a training reader will read next, in its order.

A data loader knows its shuffled order for the epoch before it reads the first
sample. It registers that order (``POST /_hoard/prefetch``: a stream id, a
bucket, the keys or a manifest object, a window in bytes); Hoard watches the
stream's GETs and keeps the blocks of the next keys cached, up to the window
in bytes ahead of the reader's position. The reader then finds its samples
cached instead of waiting on the origin for each one.

- ``order.py``: what a registration is, and its bounds (400 beyond them).
- ``stream.py``: the position and window accounting of one stream (pure).
- ``prefetcher.py``: the streams the node's leader follows, the task fetching for each.
- ``registry.py``, ``node.py``: the node's streams, shared by its workers (below).
- ``api.py``: the admin endpoints and the peer messages of a cluster.

Where a stream lives in a node. With ``workers: N`` a registration, a GET
and a status call may each reach a different worker. The registration is
the node's: written to ``cache.dir/prefetch`` by whichever worker takes it;
each worker places the GETs it serves in the orders it knows and writes the
position to the stream's mapped slot; the node's leader worker alone follows
the streams, fetching ahead into the node's disk tier, and publishes their
status for the others (``node.py``). So the node holds one window per
stream, whichever workers the reader's connections reach.

Where a stream lives in a cluster. A GET may reach any node, and blocks live
on their owners (rendezvous hashing). The registration is therefore broadcast
to every live node, and each node follows the GETs *it* serves: the node that
accepted the registration starts fetching at once, the others when they first
see a GET of the stream. Blocks go through ``BlockSource.preload``: an owned
block fills to this node's disk, a block owned elsewhere is asked of its
owner (a peer fill), which fills it from the origin once; so the work is
spread by ownership and the origin sees each block once whichever nodes the
reader talks to. The alternative, one home node per stream told of every GET
by the others, would cost a peer message per GET on the read path; this way a
GET costs a dictionary lookup per registered stream, and a node that serves
none of a stream's GETs holds only its order.

Not guaranteed: that the window is exact when GETs of one stream are spread
over several nodes (each keeps its own position and window, so the cluster
may hold up to one window per node ahead); that a registration reaches a node
that is down when it is made (that node starts the stream when re-registered:
the next epoch). Prefetched blocks are admitted to disk whatever the admission
policy says: the client declared it will read them.
"""
