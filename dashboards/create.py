"""Save longeval's standard W&B workspace (and, with --report, a report) for a project.

    python dashboards/create.py --entity E --project P [--suite ruler ...] [--report]

The same as `longeval dashboards create ...`; the definitions live in `longeval/tracking/dashboards.py`.
Needs network and W&B credentials (WANDB_API_KEY or `wandb login`).
"""

import sys

from longeval.cli import main

if __name__ == "__main__":
    sys.exit(main(["dashboards", "create", *sys.argv[1:]]))
