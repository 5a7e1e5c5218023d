"""The application: the process, the socket, the wiring, the HTTP server.

``cli.py`` is the command line (``hoard serve`` and the client commands),
``supervisor.py`` starts and restarts a node's workers (``cores.py``: how
many ``workers: auto`` means), ``safety.py`` refuses unsafe start-ups,
``posix_roots.py`` a posix origin whose folder is missing (and names the
folders served that are no bucket),
``listener.py`` binds the socket and runs the loop, ``hotwire.py`` answers
small hits inside the connection's protocol before aiohttp dispatches them,
``server.py`` is the aiohttp application (one catch-all route, request ids,
accounting), ``admin.py`` the ``/_hoard/`` endpoints, and ``wiring.py`` the
one place that builds every object of a process, in dependency order, from
one settings object.

What this package may import: everything below it. Nothing imports it but
``gateway/__main__.py``.
"""
