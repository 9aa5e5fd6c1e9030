"""Sub-commands that live outside cli.py; importing registers them."""

from . import demo_cmd  # noqa: F401
