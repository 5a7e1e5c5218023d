"""The config: one settings object, built once at start and passed down.

``settings.py`` is the contract (every key, its type, its default, its
cross-checks), ``units.py`` the quantities the YAML writes (``8MiB``,
``30s``, umasks), ``load.py`` the file itself (``${VAR}`` references,
``HOARD_`` overrides, one ``ConfigError`` naming every bad key). No module
reads the environment or a file for its settings on its own: what a part
needs reaches it through ``gateway.app.wiring``.

What this package may import: the standard library, pydantic, PyYAML. It is
the bottom of the house.
"""
