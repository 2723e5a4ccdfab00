"""What people read: roll-ups of the results (``summary``), the terminal rendering (``report``, ``verdict``),
Parquet exports (``export``), the Chrome trace (``chrome``), the timeline's view model (``timeline``) and the
HTML report (``figures``, ``html_report``). Views compute nothing the analysis does not provide."""
