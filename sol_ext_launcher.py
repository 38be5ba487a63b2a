"""The ``sol-ext`` command's entry point.

It lives outside the ``sol_ext`` package on purpose: importing the package loads torch and the
compiled kernels, which takes seconds, and a Ctrl-C in that time would otherwise end the program
with a ``KeyboardInterrupt`` traceback. Here the import itself is guarded.
"""

import sys

EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a program ended by Ctrl-C


def main() -> int:
    """Import and run ``sol_ext.cli.main``; a Ctrl-C at any point exits quietly with 130."""
    try:
        from sol_ext.cli import main as cli_main
    except KeyboardInterrupt:
        print("sol-ext: interrupted while starting; nothing was written.", file=sys.stderr)
        return EXIT_INTERRUPTED
    try:
        return cli_main()
    except KeyboardInterrupt:  # outside a command (argument parsing): nothing was written either
        print("sol-ext: interrupted; nothing was written.", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
