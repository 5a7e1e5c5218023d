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
    "gateway.s3._sigv4_repeat",
]
# OpenSSL's SHA-256 (libcrypto, the library Python's hashlib uses): its structure-level
# functions, deprecated by OpenSSL 3 for EVP's, which is the cost they are there to avoid.
LINKED = {
    "gateway.s3._sigv4_repeat": {
        "libraries": ["crypto"],
        "extra_compile_args": ["-Wno-deprecated-declarations"],
    },
}


def _extensions() -> list[Extension]:
    try:
        from Cython.Build import cythonize
    except ImportError:
        return []
    modules = [
        Extension(name, [name.replace(".", "/") + ".pyx"], **LINKED.get(name, {}))  # type: ignore[arg-type]
        for name in EXTENSIONS
    ]
    built = cythonize(modules, language_level=3, quiet=True)
    for extension in built:  # set after: cythonize's copies do not keep the flag
        extension.optional = True  # no compiler: a warning, and the Python twins run
    return built


setup(ext_modules=_extensions())
