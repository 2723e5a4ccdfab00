"""Jobs too big for memory: each input file becomes one rank's partition of a Parquet dataset, in local
processes or on Dask (``engine``, ``dataset``), a file bigger than the budget is read in bounded memory
(``bounded``), and the analysis is combined from the small tables (``analyse``)."""
