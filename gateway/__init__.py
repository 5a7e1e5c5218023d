"""Hoard: an S3 caching gateway for machine-learning training data.

See ``ARCHITECTURE.md`` at the root of the repository for the module map, what
each package may import, and the path of a cold and a warm GET.
"""

__version__ = "0.1.0"
