"""Sub-commands that live outside cli.py; importing registers them."""

from . import bench_cmd, demo_cmd, elastic_cmd, shards_cmd  # noqa: F401
