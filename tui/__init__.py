"""The Textual app of ``tracekit inspect``: it only displays analysis results."""
