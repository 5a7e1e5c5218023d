"""Hoard: an S3 caching gateway for machine-learning training data.

See ``DESIGN.md`` (in the shared folder) for the path of a GET and the module map.
"""

__version__ = "0.1.0"
