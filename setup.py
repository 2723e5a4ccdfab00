"""The C extensions: the Kineto parser's and the graph engine's; everything else about the package is in pyproject.toml.

``pip install -e .`` (or any install) compiles ``parsers/kineto/scan.c`` (with the two headers it includes,
``scan_json.h`` and ``scan_records.h``) into ``tracekit.parsers.kineto.scan``, and ``tracekit/engine/_kernels.c``
into ``tracekit.engine._kernels``, with the platform's C compiler and Python headers. Where there are none, the
install goes on without them (setuptools warns): the parser gives the same tables without its module, about
2.4x slower, and the analysis the same graphs, paths and predictions by numpy (``TRACEKIT_NO_EXTENSION=1`` shows
both). CI sets ``TRACEKIT_REQUIRE_EXTENSION=1``, under which the tests fail when either was not built.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("tracekit.parsers.kineto.scan", ["parsers/kineto/scan.c"],
                             depends=["parsers/kineto/scan_json.h", "parsers/kineto/scan_records.h"],
                             extra_compile_args=["-O3", "-std=gnu11", "-fno-fast-math", "-Wall"],
                             optional=True),
                   Extension("tracekit.engine._kernels", ["tracekit/engine/_kernels.c"],
                             extra_compile_args=["-O3", "-std=gnu11", "-fno-fast-math", "-Wall"], optional=True)])
