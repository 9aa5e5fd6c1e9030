"""Sub-commands that live outside cli.py; importing registers them."""

from zephon_vl.cli import bench, demo, elastic, index, shards  # noqa: F401
