"""``python -m sol_ext.driver``: the same as the ``sol-ext`` command (``torchrun -m sol_ext.driver``)."""

import sys

from sol_ext_launcher import main

sys.exit(main())
