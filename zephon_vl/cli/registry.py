"""The command registry: `@command(name, help, configure)` adds a `zephon-vl` command.

Below every command module and `main`: a command module imports `command` from
here, `commands.py` imports the command modules, and `main` imports `commands`
and reads `COMMANDS`, so no command module imports `main`.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

Command = Callable[[argparse.Namespace], int]
COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None], Command]] = {}


def command(name: str, help_text: str, configure: Callable[[argparse.ArgumentParser], None]):
    def wrap(fn: Command) -> Command:
        COMMANDS[name] = (help_text, configure, fn)
        return fn
    return wrap
