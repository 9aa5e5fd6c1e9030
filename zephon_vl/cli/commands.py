"""Sub-commands that live outside cli.py; importing registers them."""

from zephon_vl.cli import bench, demo, elastic, inspect, replay, shards, verify  # noqa: F401
