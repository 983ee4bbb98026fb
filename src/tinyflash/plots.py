"""``python -m tinyflash.plots``: redraw the README's figures. The code is in ``tinyflash.measure.plots``."""

import sys

from .measure.plots import main

if __name__ == "__main__":
    sys.exit(main())
