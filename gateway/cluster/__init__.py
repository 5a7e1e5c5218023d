"""The cluster: which node owns a block, and which nodes are there to own it.

Hoard nodes are stateless fronts: any node answers any request, and every block
has an owner chosen by rendezvous (highest-random-weight) hashing over the live
nodes, so a dataset is cached once per cluster and a node joining or leaving
moves only its own share of blocks. Two small mechanisms, combined elsewhere:

- ``rendezvous.py`` is a pure function: given live nodes (with weights) and a
  key, the nodes best first. Owner is the first, ``cluster.replicas`` R means
  the first R hold the block, and the rest are where a reader falls back to, in
  order. It knows nothing of health or HTTP.
- ``membership.py`` keeps the member set (static peers, DNS, this node) and its
  live subset, from active probes and passive reports, with hysteresis. It
  knows nothing of keys; it publishes a sorted live list and a version that
  bumps on change, from which the caller builds a new ``Ranking``.

On top of them, each a small module:

- ``peers.py``: the signed ``/_hoard/peer/`` wire (blocks, cached-only
  blocks, metadata answers, invalidations), answered by ``peer_server.py``
  and asked by ``peer_client.py``; requests are signed for the receiving
  node with a nonce, answers are signed over the request.
- ``replays.py``: the nonces a node accepted, shared by its workers, so a
  captured request is refused when it comes again.
- ``placement.py``: block fills from the owners ranked before this node, and
  the handoff from the nodes ranked after it (scale-out without refetch).
- ``directory.py``: LIST and HEAD misses asked of their metadata owner.
- ``backlog.py``: invalidations a peer missed, replayed when it is back.
- ``node.py``: this node's part, built once by ``app/wiring.py``.

The read path (``read/reader.py``) combines them with the peer client, the way
groupcache's ``groupcache.go`` combines its consistent hash and its peers.

Not guaranteed:
- Agreement. Each node has its own view of who is live; during a change two
  nodes may name different owners for a block for a few seconds. The cost is
  an extra origin fill or an extra peer hop, never wrong bytes (blocks are
  named by ETag and checked on read).
- Instant detection. A dead peer leaves after ``fail_after`` failed probes or
  requests (about two seconds with the defaults) and returns after
  ``rejoin_after`` successes; in between, requests to it fail and the caller
  falls back along the ranking.
- One identity per node. A node must be named by the same URL in every view:
  with DNS discovery, ``cluster.self`` must be ``http://<pod-ip>:<port>``,
  or this node appears twice (as itself and as its address).
- Sharing across workers. Each worker process keeps its own membership and
  probes on its own; none of it is thread-safe (one event loop each).
"""
