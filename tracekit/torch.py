"""``import tracekit.torch``: the profiler set-up for training scripts, under the name users write in their
training loops — the very module :mod:`tracekit.capture.torch` (one module object, not a copy)."""

import sys

from tracekit.capture import torch as _torch

sys.modules[__name__] = _torch
