"""The dependency graph and what is replayed on it: its build (dag, inferred edges, the compact graph of a rank), the
contention fit, replays, critical paths and the what-if model; the loops themselves run in tracekit.engine."""
