"""Horovod timelines in the analysis: iterations and the per-window and per-tensor tables (windows), the timeline put
on rank 0's clock (align) and its phases prepared (prep)."""
