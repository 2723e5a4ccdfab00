"""The orders of ``tracekit collectives`` and ``tracekit tensors`` (``--sort``): name -> (column, largest first).
A module of their own, so that the command line builds its choices without importing the screens (rich's tables)."""

from __future__ import annotations

SORTS = {"time": ("first_start_ns", False), "skew": ("skew_ns", True), "wait": ("wait_ns", True),
         "transfer": ("transfer_ns", True), "bytes": ("bytes", True), "busbw": ("busbw_gbps", True),
         "utilisation": ("link_utilisation", True)}

TENSOR_SORTS = {"transfer": ("transfer_ns", True), "negotiation": ("negotiate_ns", True),
                "bytes": ("bytes", True), "busbw": ("busbw_gbps", True), "instances": ("instances", True),
                "name": ("tensor", False)}
