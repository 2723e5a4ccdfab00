"""Running the integrations' sample jobs (samples/lightning_train.py, samples/huggingface_train.py) as the real
2-process jobs they are: torchrun, CPU, gloo, no network."""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

SAMPLES = Path(__file__).resolve().parents[1] / "samples"


def needs(*modules: str) -> pytest.MarkDecorator:
    """Skip where a library is not installed (it is in the test extra), without importing it at collection (lightning
    and transformers take seconds to import)."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    return pytest.mark.skipif(bool(missing), reason=f"not installed: {', '.join(missing)}")


def torchrun(script: str, args: list[str], cwd: Path, timeout: float = 420) -> subprocess.CompletedProcess[str]:
    """``torchrun --standalone --nproc_per_node 2 samples/<script> <args>`` in ``cwd``, offline, one thread per
    process; fails the test with the job's output when it does not exit 0."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "WANDB_MODE": "offline", "WANDB_SILENT": "true", "TOKENIZERS_PARALLELISM": "false"}
    env.pop("TRACEKIT_RUN_DIR", None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           str(SAMPLES / script), *args]
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{script} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    return done


def trace_json(path: Path) -> dict[str, Any]:
    """A Kineto trace (gzipped or not) as JSON."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return json.load(f)


def without_distributed_info(src: Path, dst: Path) -> Path:
    """A copy of the trace ``src`` at ``dst`` without ``distributedInfo`` (as a trace recorded outside
    torch.distributed has it): its rank must then come from its name."""
    data = trace_json(src)
    data.pop("distributedInfo")
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_text(json.dumps(data))
    return dst


def steps(trace: dict[str, Any]) -> list[str]:
    """The trace's ProfilerStep#N marks, sorted."""
    return sorted(e["name"] for e in trace["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#"))
