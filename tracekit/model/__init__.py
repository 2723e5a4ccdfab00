"""The data model: Arrow schemas of every table (``schema``), units and rates (``units``), and how problems
with the inputs are reported (``diagnostics``). Everything else builds on it; it imports nothing of tracekit."""
