"""``python -m tinyflash.plots``: redraw the README's figures (the code is in ``tinyflash.plots``)."""

import sys

from . import main

sys.exit(main())
