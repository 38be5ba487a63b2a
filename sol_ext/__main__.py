"""``python -m sol_ext``: the same as the ``sol-ext`` command."""

import sys

from .driver.cli import main

sys.exit(main())
