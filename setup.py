"""The compiled twins of the hit path's hot functions (``gateway/core/compiled.py``).

Everything else about the package is in ``pyproject.toml``. Each extension is
optional: without a C compiler (or without Cython, in a build that did not
install it) ``pip install`` still succeeds and Hoard runs the Python twins.
"""

from setuptools import Extension, setup

EXTENSIONS = [  # gateway/core/compiled.py's TWINS
    "gateway.core._heads",
    "gateway.s3._sigv4_claim",
    "gateway.s3._sigv4",
    "gateway.s3._signed_form",
]


def _extensions() -> list[Extension]:
    try:
        from Cython.Build import cythonize
    except ImportError:
        return []
    modules = [Extension(name, [name.replace(".", "/") + ".pyx"]) for name in EXTENSIONS]
    built = cythonize(modules, language_level=3, quiet=True)
    for extension in built:  # set after: cythonize's copies do not keep the flag
        extension.optional = True  # no compiler: a warning, and the Python twins run
    return built


setup(ext_modules=_extensions())
