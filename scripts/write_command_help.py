"""Write ``sol_ext/driver/command_help.json``: each command's parser as data, from which the ``sol-ext``
launcher answers ``sol-ext COMMAND --help`` without importing the package (and so torch).

Run it after changing an option or its help: ``python scripts/write_command_help.py``
(``tests/driver/test_cli.py`` checks that the file matches the program's parser).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sol_ext_launcher import COMMAND_HELP_FILE, describe_parser  # noqa: E402


def command_descriptions() -> dict:
    """``{command: describe_parser(its parser)}`` of :func:`sol_ext.driver.cli.build_parser`."""
    from sol_ext.driver.cli import build_parser

    commands = build_parser()._subparsers._group_actions[0].choices
    return {name: describe_parser(parser) for name, parser in commands.items()}


def command_help_text() -> str:
    return json.dumps(command_descriptions(), indent=1, ensure_ascii=False) + "\n"


if __name__ == "__main__":
    path = ROOT / "sol_ext" / COMMAND_HELP_FILE
    path.write_text(command_help_text(), encoding="utf-8")
    print(f"wrote {path}")
