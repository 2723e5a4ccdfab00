"""Loading traces: finding the files of a job and reading them through the parsers into one ``TraceSet``
(``traceset``), the parse cache of memory-mapped Arrow tables (``cache``), and atomic writes (``atomic``)."""
