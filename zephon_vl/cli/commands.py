"""The command modules, listed once: importing this module registers every `zephon-vl` command."""

from zephon_vl.cli import (  # noqa: F401
    balance,
    bench,
    check_batches,
    demo,
    digest,
    elastic,
    index,
    inspect,
    inspect_data,
    profile,
    replay,
    shards,
    tokenizer,
    verify,
)
