"""Hoard's benchmarks: Hoard against what users would otherwise deploy, in one run.

One run (``run.py``) starts an origin that behaves like a remote store
(``origin.py``: moto in a network namespace behind a counting, delaying proxy),
seeds it with the datasets (``datasets.py``), and then, for every target
(``targets.py``) and every workload (``workloads.py``, ``wrkload.py``), starts
the target cold, drives it with load generators pinned away from it
(``clients.py``: boto3, wrk), and stops it. ``report.py`` turns the rows into
JSON, Markdown, ratios and the issue's goals; ``plots.py`` into PNGs.

What it does not guarantee: absolute numbers. The machine is small and
shared, and moto is a slow origin. Only ratios between targets measured in the
same run are the result. Nothing here asserts on speed.
"""
