"""longeval: how well do language models use long contexts?"""

import os

# Arrow's default allocator (mimalloc) keeps what each reading thread freed: a driver that read a few metadata
# columns of every shard kept about 0.2 MB per shard, so its memory grew with the suite. The C library's
# allocator returns it (benchmarks/README.md, "Where the driver's growth went"). Read by pyarrow when it loads,
# so it is set before any longeval module imports pyarrow; a user's own setting wins.
os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")

__version__ = "0.1.0"
