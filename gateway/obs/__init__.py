"""Observability: what Hoard tells its operators, in one place.

``metrics.py`` defines every Prometheus metric (one place, as the house
rules ask), ``counting.py`` is what one request counts (the methods
``Metrics`` inherits), ``tally.py`` adds per-request counts up in plain Python and hands
them to their series once per loop turn (the hit path's budget),
``events.py`` turns the guard's, blocks' and peers' events into those
metrics, ``process.py`` covers the node's processes and the workers'
multiprocess mode, ``access_log.py`` writes one line per request in
batches, and ``request_keys.py`` names what a request carries from where it
is answered to where it is accounted.

What this package may import: the standard library, prometheus-client,
aiohttp (request keys only), ``gateway.core`` and ``gateway.config``. The
layers above report into it through the objects the wiring hands them.
"""
