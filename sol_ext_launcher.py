"""The ``sol-ext`` command's entry point.

It lives outside the ``sol_ext`` package on purpose: importing the package loads torch and the
compiled kernels, which takes seconds, and a Ctrl-C in that time would otherwise end the program
with a ``KeyboardInterrupt`` traceback, or worse: some libraries swallow a KeyboardInterrupt raised
inside their own import and go on half-initialized. So while the package loads, Ctrl-C does not
raise at all: it ends the program at once.

``sol-ext --help`` and ``sol-ext --version`` are answered here, without loading the package (and so
torch): the version from the installed distribution's metadata, the help from :func:`top_level_parser`,
which holds the same text as the program's own parser (``sol_ext.driver.cli.build_parser``; a test
keeps the two equal). A command's own help (``sol-ext predict --help``) needs the program's parser,
which is built inside the package.
"""

import argparse
import importlib.metadata
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


# What `sol-ext --help` shows: the program's description, its options and each command's one line, as
# sol_ext.driver.cli.build_parser gives them.
DESCRIPTION = "Stochastic Order Learning: rank estimation from noisy labels."
TRACEBACK_HELP = ("print the full traceback above an error's one line (also SOL_EXT_TRACEBACK=1): for "
                  "debugging your data or the package")
COMMANDS = (("train", "train one model and report test MAE/CS"),
            ("predict", "predict labels for new data with a trained run"),
            ("export", "write a trained run as a torch.export (.pt2) or ONNX (.onnx) program"),
            ("audit", "list the training labels that look wrong, as CSV"),
            ("compare", "SOL against the baselines under label noise"))


def installed_version() -> str:
    """The version of the installed ``sol_ext`` distribution, read from its metadata."""
    return importlib.metadata.version("sol_ext")


def top_level_parser(version: str) -> argparse.ArgumentParser:
    """The program's parser down to the commands' names, for ``--help`` and ``--version``."""
    parser = argparse.ArgumentParser(prog="sol-ext", description=DESCRIPTION)
    parser.add_argument("-V", "--version", action="version", version=f"%(prog)s {version}")
    parser.add_argument("--traceback", action="store_true", default=False, help=TRACEBACK_HELP)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, text in COMMANDS:
        sub.add_parser(name, help=text)
    return parser


def answer_without_the_package(argv: list) -> bool:
    """Answer ``sol-ext --help`` / ``-h`` / ``--version`` / ``-V`` (alone) here; False for anything
    else, which the program answers."""
    if len(argv) != 1 or argv[0] not in ("-h", "--help", "-V", "--version"):
        return False
    try:
        version = installed_version()
    except importlib.metadata.PackageNotFoundError:  # a source tree without an install: the package says
        return False
    try:
        top_level_parser(version).parse_args(argv)
    except SystemExit:  # argparse's way out after printing
        pass
    return True


def _quit_while_starting(signum, frame) -> None:
    # Nothing has been written yet, so there is nothing to clean up.
    sys.stderr.write("sol-ext: interrupted while starting; nothing was written.\n")
    sys.stderr.flush()
    os._exit(EXIT_INTERRUPTED)


def main() -> int:
    """Import and run ``sol_ext.driver.cli.main``; a Ctrl-C at any point exits quietly with 130."""
    if answer_without_the_package(sys.argv[1:]):
        sys.stdout.flush()
        return 0
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
