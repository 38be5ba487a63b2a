"""The ``sol-ext`` command's entry point.

It lives outside the ``sol_ext`` package on purpose: importing the package loads torch and the
compiled kernels, which takes seconds, and a Ctrl-C in that time would otherwise end the program
with a ``KeyboardInterrupt`` traceback, or worse: some libraries swallow a KeyboardInterrupt raised
inside their own import and go on half-initialized. So while the package loads, Ctrl-C does not
raise at all: it ends the program at once.
"""

import importlib.util
import os
import signal
import sys

EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a program ended by Ctrl-C
EXIT_MISSING = 1

# The modules of the `train` extra (setup.py) that the program imports: `pip install sol_ext` gives the
# library alone, and the program says how to add what it needs before anything fails half-way.
PROGRAM_MODULES = {"pyarrow": "pyarrow", "matplotlib": "matplotlib", "tqdm": "tqdm", "PIL": "pillow",
                   "tomli_w": "tomli-w", "sklearn": "scikit-learn"}
INSTALL_PROGRAM = "pip install 'sol_ext[train]'   (from a source folder: pip install '.[train]')"


def missing_program_packages() -> list:
    """The packages of the `train` extra that this environment lacks (pip names)."""
    return [package for module, package in PROGRAM_MODULES.items() if importlib.util.find_spec(module) is None]


def _quit_while_starting(signum, frame) -> None:
    # Nothing has been written yet, so there is nothing to clean up.
    sys.stderr.write("sol-ext: interrupted while starting; nothing was written.\n")
    sys.stderr.flush()
    os._exit(EXIT_INTERRUPTED)


def main() -> int:
    """Import and run ``sol_ext.driver.cli.main``; a Ctrl-C at any point exits quietly with 130."""
    missing = missing_program_packages()
    if missing:
        sys.stderr.write(f"sol-ext: the program needs {', '.join(missing)}, which the library alone does not "
                         f"install. Add them with:\n    {INSTALL_PROGRAM}\n")
        return EXIT_MISSING
    previous = signal.signal(signal.SIGINT, _quit_while_starting)
    try:
        from sol_ext.driver.cli import main as cli_main
    finally:
        signal.signal(signal.SIGINT, previous)
    from sol_ext.driver.cli import end_process

    try:
        status = cli_main()
    except KeyboardInterrupt:  # outside a command (argument parsing): nothing was written either
        print("sol-ext: interrupted; nothing was written.", file=sys.stderr)
        status = EXIT_INTERRUPTED
    end_process(status)  # without the interpreter's shutdown (see there)
    return status  # not reached


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
