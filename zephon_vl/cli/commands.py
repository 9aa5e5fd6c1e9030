"""The command modules, listed once: importing this module registers every `zephon-vl` command."""

from zephon_vl.cli import bench, demo, elastic, index, inspect, replay, shards, verify  # noqa: F401
