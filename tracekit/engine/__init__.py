"""The dependency-graph engine: its loops in C (``_kernels.c``, built with the package), arrays in, arrays out.

A graph here is nodes ``0..n-1`` and edges ``src -> dst`` with a weight each (int64 ns); nothing else about a job.

- :func:`plan` — the graph's topological order and every node's incoming edges (Kahn), made once per graph and set
  of edges (None where the edges close a cycle); :func:`asap` — the ASAP schedule under new weights in one pass:
  every node at the max over its incoming edges of (source time + weight), sources at their given times.
- :func:`bind` — per node its binding edge (the one attaining its time) and the slack left on it; :func:`chase` —
  the chain back along binding edges from a node: a critical path; :func:`walk` — that chain's segments, each
  labelled by what its time was spent on.
- :func:`grid` / :func:`iteration_times` — many scenarios of one plan, each a few edges re-weighted, answered by
  their iteration times (:func:`period`: the median time between iteration starts) without an array of the graph's
  size per scenario.

The analysis (:mod:`tracekit.analysis.graph.dag`, ``replay``, ``critical_path``, ``whatif``) builds the graphs and reads
the answers (:func:`tracekit.analysis.graph.dag.engine`); where the extension is not built (no C compiler at install) or
``TRACEKIT_NO_EXTENSION=1``, its numpy paths give the same answers, slower.
"""

from tracekit.engine.paths import bind, chase, walk
from tracekit.engine.scenarios import Grid, Iterations, grid, iteration_times, iterations, period
from tracekit.engine.schedule import MAX_SIZE, Plan, asap, plan

__all__ = ["MAX_SIZE", "Grid", "Iterations", "Plan", "asap", "bind", "chase", "grid", "iteration_times", "iterations",
           "period", "plan", "walk"]
