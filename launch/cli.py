"""The ``draftsmith`` command line: ``zoo``, ``eval``, ``tune``, ``data``, ``export`` and ``demo``.

Each subcommand lives in its own module with ``add_parser(subparsers)`` and ``run(args) -> int``;
they are imported only when the command line is built, never at package import.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from draftsmith.common import __version__
from draftsmith.common.errors import DraftsmithError, error_line
from draftsmith.common.registry import method_commands

SUBCOMMANDS = {
    "zoo": "draftsmith.launch.zoo_cli",
    "eval": "draftsmith.launch.eval_cli",
    "demo": "draftsmith.launch.demo",
    "tune": "draftsmith.launch.tune_cli",
    "export": "draftsmith.launch.export_cli",
    "data": "draftsmith.launch.data_cli",
    "train": "draftsmith.launch.train_cli",
    "engine": "draftsmith.launch.engine_cli",
    "memory": "draftsmith.launch.memory_cli",
}


class OneLineParser(argparse.ArgumentParser):
    """argparse with the project's error convention: one ``error:`` line naming the command (no usage dump), exit 2;
    its subcommands' parsers are of the same class."""

    def error(self, message: str):
        self.exit(2, f"error: {self.prog}: {message} (see {self.prog} --help)\n")

    def parse_known_args(self, args=None, namespace=None):
        """argparse's own parse, and one check it lacks: ``--prompts=--`` leaves a single-valued option an empty list
        (``--`` taken as the end of the options), which the command would meet as a traceback."""
        namespace, extras = super().parse_known_args(args, namespace)
        for action in self._actions:
            single = isinstance(action, argparse._StoreAction) and action.nargs is None  # not append, not nargs
            if single and action.type is not None and isinstance(getattr(namespace, action.dest, None), list):
                self.error(f"argument {'/'.join(action.option_strings) or action.dest}: expected one value")
        return namespace, extras


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="draftsmith", description="Train speculative-decoding drafters and prove they are fast and lossless."
    )
    parser.add_argument("--version", action="version", version=f"draftsmith {__version__}")
    commands = SUBCOMMANDS | method_commands()  # the generic ones, then those the registry's methods add
    sub = parser.add_subparsers(dest="command", required=True, metavar="{" + ",".join(commands) + "}")
    for module in commands.values():
        importlib.import_module(module).add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.run(args) or 0)
    except DraftsmithError as err:
        print(error_line(err), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted; completed work is kept (checkpoints are atomic, rerun to resume)", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
