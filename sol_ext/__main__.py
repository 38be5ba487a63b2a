"""``python -m sol_ext``: the same as the ``sol-ext`` command."""

import sys

from .cli import main

sys.exit(main())
