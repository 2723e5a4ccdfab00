"""What the records of a Horovod timeline mean (:mod:`tracekit.parsers.horovod`): the format's name (also the
category, process group and source of its rows), the kind of each phase, the ops, the sizes of Horovod's
dtypes and the element count of a logged shape.
"""

from __future__ import annotations

#: the format's name, also the ``cat``, ``pg`` and ``source`` of its rows (re-exported by the package)
FORMAT = "horovod"

# ---------------------------------------------------------------------------------------------------
# Phase vocabulary

_OPS = {
    "ALLREDUCE": "allreduce",
    "ALLGATHER": "allgather",
    "BROADCAST": "broadcast",
    "REDUCESCATTER": "reduce_scatter",
    "ALLTOALL": "all_to_all",
    "ADASUM": "adasum",
    "JOIN": "join",
    "BARRIER": "barrier",
}
_TRANSFER_PREFIXES = ("NCCL_", "MPI_", "GLOO_", "CCL_")
_DTYPE_SIZE = {
    "uint8": 1, "int8": 1, "bool": 1, "uint16": 2, "int16": 2, "float16": 2, "bfloat16": 2,
    "int32": 4, "float32": 4, "int64": 8, "float64": 8,
}


def phase_kind(name: str) -> str:
    """The event kind (tracekit.model.schema.KINDS) of a Horovod phase name."""
    if name.startswith(_TRANSFER_PREFIXES):
        return "comm"
    if name.startswith("NEGOTIATE_") or name.startswith("WAIT_FOR_"):
        return "wait"
    if name == "QUEUE":
        return "queue"
    if name.startswith("MEMCPY_") or name == "COPY_ALLGATHER_OUTPUT":
        return "memory"
    return "annotation"


def _shape_count(shape: str | None) -> int | None:
    """Elements of a Horovod ``TensorShape::DebugString`` (``"[1024, 4096]"``; ``"[]"`` is a scalar)."""
    if shape is None:
        return None
    s = shape.strip()
    if not (s.startswith("[") and s.endswith("]")):
        return None
    body = s[1:-1].strip()
    n = 1
    if not body:
        return n
    for part in body.split(","):
        part = part.strip()
        if not part.lstrip("-").isdigit():
            return None
        n *= int(part)
    return n if n >= 0 else None
