"""``python -m sol_ext``: the same as the ``sol-ext`` command."""

from .driver.cli import end_process, main

end_process(main())  # without the interpreter's shutdown (see there)
