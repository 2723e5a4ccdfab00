"""tracekit: where does each iteration's time go in a distributed training job, and is the network the
bottleneck? Parsers turn traces into Arrow tables; analysis modules are pure functions over them."""

__version__ = "0.1.0"
