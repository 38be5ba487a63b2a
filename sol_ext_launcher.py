"""The ``sol-ext`` command's entry point.

It lives outside the ``sol_ext`` package on purpose: importing the package loads torch and the
compiled kernels, which takes seconds, and a Ctrl-C in that time would otherwise end the program
with a ``KeyboardInterrupt`` traceback, or worse: some libraries swallow a KeyboardInterrupt raised
inside their own import and go on half-initialized. So while the package loads, Ctrl-C does not
raise at all: it ends the program at once.

``sol-ext --help`` and ``sol-ext --version`` are answered here, without loading the package (and so
torch): the version from the installed distribution's metadata, the help from :func:`top_level_parser`,
which holds the same text as the program's own parser (``sol_ext.driver.cli.build_parser``; a test
keeps the two equal). A command's own help (``sol-ext predict --help``) too: the program's parser of
each command is saved as data in the package (:data:`COMMAND_HELP_FILE`, written by
``scripts/write_command_help.py``; a test keeps it equal to the parser) and rebuilt here with argparse.
"""

import argparse
import importlib.metadata
import importlib.util
import json
import os
import signal
import sys
from pathlib import Path

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


# Each command's parser as data (describe_parser), in the sol_ext package folder: `sol-ext train --help`
# is answered from it without importing the package.
COMMAND_HELP_FILE = Path("driver", "command_help.json")
HELP_FLAGS = ("-h", "--help")


def describe_parser(parser: argparse.ArgumentParser) -> dict:
    """What ``parser``'s help shows, as JSON data (:func:`parser_from_description` rebuilds it): its
    prog and description, its argument groups in order and the options of each, the mutually
    exclusive groups. Parsing needs more (types, actions): this is for the help only."""
    actions = [a for a in parser._actions if not isinstance(a, argparse._HelpAction)]
    index = {id(a): i for i, a in enumerate(actions)}

    def shown(default):  # what %(default)s shows
        return default if default is None or isinstance(default, (str, int, float)) else str(default)

    return {
        "prog": parser.prog, "description": parser.description,
        "actions": [{"option_strings": list(a.option_strings), "dest": a.dest, "nargs": a.nargs,
                     "metavar": list(a.metavar) if isinstance(a.metavar, tuple) else a.metavar,
                     "choices": None if a.choices is None else [str(c) for c in a.choices],
                     "required": a.required, "default": shown(a.default), "help": a.help} for a in actions],
        "groups": [{"title": g.title, "description": g.description,
                    "actions": [index[id(a)] for a in g._group_actions if id(a) in index]}
                   for g in parser._action_groups],
        "exclusive": [[index[id(a)] for a in g._group_actions] for g in parser._mutually_exclusive_groups],
    }


def parser_from_description(description: dict) -> argparse.ArgumentParser:
    """A parser whose help is that of the parser :func:`describe_parser` described."""
    parser = argparse.ArgumentParser(prog=description["prog"], description=description["description"])
    home = {}
    for k, group in enumerate(description["groups"]):
        if k < len(parser._action_groups):  # the parser's own: positional arguments, options
            container = parser._action_groups[k]
            container.title, container.description = group["title"], group["description"]
        else:
            container = parser.add_argument_group(group["title"], group["description"])
        home.update(dict.fromkeys(group["actions"], container))
    for members in description["exclusive"]:
        exclusive = home[members[0]].add_mutually_exclusive_group()
        home.update(dict.fromkeys(members, exclusive))
    for i, action in enumerate(description["actions"]):
        # argparse knows SUPPRESS by identity, not by its text
        options = {key: argparse.SUPPRESS if action[key] == argparse.SUPPRESS else action[key]
                   for key in ("help", "default")}
        if action["nargs"] == 0:  # a flag (store_true and the like)
            options.update(action="store_const", const=None)
        else:
            metavar = action["metavar"]
            options.update(nargs=action["nargs"], choices=action["choices"],
                           metavar=tuple(metavar) if isinstance(metavar, list) else metavar)
        if action["option_strings"]:
            home[i].add_argument(*action["option_strings"], dest=action["dest"], required=action["required"],
                                 **options)
        else:
            home[i].add_argument(action["dest"], **options)
    return parser


def command_help_parser(command: str):
    """The help parser of ``command`` from :data:`COMMAND_HELP_FILE`, or None where the package
    folder or the file is not found (a source tree without it: the program answers)."""
    spec = importlib.util.find_spec("sol_ext")  # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        return None
    try:
        path = Path(list(spec.submodule_search_locations)[0], COMMAND_HELP_FILE)
        described = json.loads(path.read_text(encoding="utf-8")).get(command)
    except (OSError, ValueError):
        return None
    return None if described is None else parser_from_description(described)


def answer_without_the_package(argv: list) -> bool:
    """Answer ``sol-ext --help`` / ``-h`` / ``--version`` / ``-V`` (alone) and ``sol-ext COMMAND
    --help`` here; False for anything else, which the program answers."""
    if len(argv) == 2 and argv[0] in dict(COMMANDS) and argv[1] in HELP_FLAGS:
        parser = command_help_parser(argv[0])
        if parser is None:
            return False
        parser.print_help()
        return True
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
