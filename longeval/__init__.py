"""longeval: how well do language models use long contexts?

The command line is `longeval.cli`; each subsystem is a package whose `__init__` names its public surface
(`longeval.store`, `longeval.run`, `longeval.tasks`, ...; tests/test_imports.py holds their layering). Importing
`longeval` itself loads none of them: it offers the version only.
"""

import os

# Arrow's default allocator (mimalloc) keeps what each reading thread freed: a driver that read a few metadata
# columns of every shard kept about 0.2 MB per shard, so its memory grew with the suite. The C library's
# allocator returns it (benchmarks/README.md, "Where the driver's growth went"). Read by pyarrow when it loads,
# so it is set before any longeval module imports pyarrow; a user's own setting wins.
os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")

__all__ = ["__version__"]

__version__ = "0.1.0"
