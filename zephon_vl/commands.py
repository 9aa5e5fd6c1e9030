"""Sub-commands that live outside cli.py; importing registers them."""

from . import demo_cmd, elastic_cmd, shards_cmd  # noqa: F401
