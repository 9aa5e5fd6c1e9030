"""Sub-commands that live outside cli.py; importing registers them."""

from zephon_vl.cli import balance, bench, demo, elastic, shards  # noqa: F401
