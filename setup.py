"""The C extension of the Kineto parser; everything else about the package is in pyproject.toml.

``pip install -e .`` (or any install) compiles ``parsers/_kineto_scan.c`` into ``tracekit.parsers._kineto_scan``
with the platform's C compiler and Python headers. A build that fails fails the install: the parser works
without the module (``TRACEKIT_NO_EXTENSION=1`` shows how), but slower, and CI must know it was built.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("tracekit.parsers._kineto_scan", ["parsers/_kineto_scan.c"],
                             extra_compile_args=["-O3", "-std=gnu11", "-fno-fast-math", "-Wall"])])
