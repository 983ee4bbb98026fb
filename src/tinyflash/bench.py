"""``python -m tinyflash.bench``: the GPU benchmarks. The code is in ``tinyflash.measure.bench``."""

import sys

from .measure.bench import main

if __name__ == "__main__":
    sys.exit(main())
