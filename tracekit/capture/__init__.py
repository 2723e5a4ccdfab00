"""Recording real jobs: ``tracekit record`` (``record``) and the profiler set-up for training scripts
(``torch``, imported by users as ``tracekit.torch``)."""
