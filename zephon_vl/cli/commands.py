"""The command modules, listed once: importing this module registers every `zephon-vl` command."""

from zephon_vl.cli import bench, demo, elastic, index, shards  # noqa: F401
