"""Warm jobs: preload a prefix, a key list or a manifest into the cluster's disk tiers.

A job is split by ownership, not by objects: every node of the job walks the
same objects in the same order and fills only the blocks it owns by
rendezvous hashing, through the fill path a client miss takes. So a block is
fetched once per cluster, by the node that will serve it, and a cluster warms
at the sum of its nodes' bandwidth. The node that accepted the job sums the
shares' progress (``jobs.py``); each share keeps its own progress in a small
JSON file (``store.py``) and resumes from its cursor after a restart
(``share.py``). Warm traffic runs at background priority, behind client misses.

Pinning (``pin: true``) pins each block before filling it (``cache/disk_pins.py``),
within ``cache.pin_quota`` per node; a job that would go over fails, naming the
quota, and a prefix job that clearly cannot fit is refused before it starts.

A job is the node's, not a worker's: its files in ``cache.dir/warm`` are the
state, so any worker of the node accepts, answers and cancels any job. One
worker runs each share, the one holding its claim (a ``flock``, which the
kernel drops however the worker dies); a cancel asked through another worker
is left as a file the runner looks for every ``jobs.WATCH`` seconds, and a
share whose runner died is adopted within a second or two by a sibling (or by
the replacement worker as it starts) and resumed from its last checkpoint.

Not guaranteed: one fetch per block while the nodes' views of the live set
disagree; that a job sees objects added under its prefix after it listed them;
progress read through a worker that does not run the share is its last
checkpoint (``share._CHECKPOINT_EVERY``, a second old at most).
"""
