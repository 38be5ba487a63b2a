"""``python -m sol_ext``: the same as the ``sol-ext`` command."""

import sys

from .driver.cli import end_torchrun_process, main

status = main()
end_torchrun_process(status)  # a finished run under torchrun ends here (see there)
sys.exit(status)
