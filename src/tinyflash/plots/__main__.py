"""``python -m tinyflash.plots``: redraw the figures of the README and docs/results.md (code: ``tinyflash.plots``)."""

import sys

from . import main

sys.exit(main())
