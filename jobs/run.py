"""Entry script for `ray job submit`: the same command line as `longeval`, run as the job's driver.

    ray job submit --working-dir . -- python jobs/run.py run suite=ruler model=llama31_8b

Inside a job, RAY_ADDRESS is set and the pipeline joins that cluster instead of starting a local one.
"""

import sys

from longeval.cli import main

if __name__ == "__main__":
    sys.exit(main())
