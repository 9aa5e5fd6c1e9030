"""The `zephon-vl` command line."""

from __future__ import annotations

import argparse
import sys

import zephon_vl.cli.commands  # noqa: F401  (registers every command)
from zephon_core import ZephonError
from zephon_vl.cli.registry import COMMANDS


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="zephon-vl", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (help_text, configure, _) in COMMANDS.items():
        configure(sub.add_parser(name, help=help_text, description=help_text))
    args = parser.parse_args(argv)
    try:
        return COMMANDS[args.command][2](args)
    except ZephonError as exc:
        print(f"zephon-vl {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    # `python -m zephon_vl.cli.main`: the commands register in `registry`, which this
    # __main__ copy of the module shares with any other importer
    sys.exit(main())
