"""The compiled twins of the hit path's hot functions (``gateway/core/compiled.py``).

Everything else about the package is in ``pyproject.toml``. Each extension is
optional: without a C compiler (or without Cython, in a build that did not
install it) ``pip install`` still succeeds and Hoard runs the Python twins.
"""

from setuptools import Extension, setup

EXTENSIONS = ["gateway.core._heads"]


def _extensions() -> list[Extension]:
    try:
        from Cython.Build import cythonize
    except ImportError:
        return []
    modules = [Extension(name, [name.replace(".", "/") + ".pyx"], optional=True)
               for name in EXTENSIONS]  # fmt: skip
    return cythonize(modules, language_level=3, quiet=True)


setup(ext_modules=_extensions())
