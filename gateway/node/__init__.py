"""One node, all its cores: worker processes that share one coherent state.

A training node has dozens of cores and one Python process serves about one,
so ``workers: N`` (``auto``: one per core this process may use, ``cores.py``)
runs N processes on one port (SO_REUSEPORT, started and restarted by the
supervisor, ``supervisor.py``). A request reaches whichever worker the kernel
picks, so a worker is a stateless front over the node's state: everything a
client can observe lives once per node, in ``cache.dir``, and any worker
answers for all of it.

What is shared, and how (each mechanism in its own module):

- Blocks: the disk tier (``cache/disk*.py``: one index, claims on fills, so
  a block is fetched once per node). Object metadata: the node's store
  (``metadata/store.py``) behind striped fetch locks; the workers'
  memory copies are kept honest by the invalidation journal
  (``metadata/journal.py``: a write seen by one worker is seen by all).
- Storms: identical LIST misses and missing-key HEADs over several workers
  cost one origin request per node (``pages.py``: under the fetch lock, an
  answer a sibling got while we waited is taken, as joining its flight).
- Warm jobs (``warm/store.py``, ``warm/jobs.py``): the job files are the
  state; one worker runs each share (a ``flock`` claim); any worker answers,
  lists and cancels; a share whose runner died is adopted by a sibling.
- Prefetch streams (``prefetch/registry.py``, ``prefetch/node.py``):
  registrations in files, positions in a mapped slot per stream that every
  worker's GETs write; the leader follows the streams and publishes status.
- Membership (``cluster/membership.py``): the leader probes and resolves DNS
  and writes the view (``shared.py``); the others adopt it.
- Leadership (``leader.py``): the worker holding ``cache.dir/node/leader``
  locked does what must be done once per node (probing, prefetching, and
  reporting the node-wide gauges).
- Views: ``/_hoard/stats`` sums each worker's part (``stats.py``);
  ``/metrics`` is prometheus-client's multiprocess mode over a directory the
  supervisor owns and clears at start, each gauge with the mode that keeps
  it meaningful (``obs/metrics.py``).

What stays per worker, and why: the event loop and its connections; the
memory tiers of blocks and metadata (a dict lookup is the hit path's budget:
a cross-process one would cost more than it saves; ``cache.memory`` is the
node's bound, each worker holding ``memory / N``, and the page cache holds
the disk tier's hot blocks once for all); SigV4 memos; fill tables, which
the disk tier's claims already coalesce across workers.

When a worker dies (SIGKILL included): its connections are reset, which
clients retry; the kernel drops its ``flock``s at once, so its warm shares
are adopted (a sibling looks every second, the replacement at start), and
if it led, a sibling leads within ``leader.RETRY`` seconds and carries on
from the shared files (membership health, stream positions); its block
claims are flocks too, so no block stays claimed; the supervisor drops its
live gauges and starts a replacement. Nothing here is a cache of something
else that could be left half-written: every shared file is replaced
atomically or is a mapped array of fixed slots.

Not guaranteed: that a status read through a worker that does not run the
work is newer than the last checkpoint or publication (a second at most for
warm progress; a prefetch status waits for the leader to catch up); that a
change of leader loses no prefetch fetch in flight (it is redone).
"""
