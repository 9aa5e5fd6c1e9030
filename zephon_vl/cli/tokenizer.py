"""`zephon-vl tokenizer`: build the bundled Qwen3.6 tokenizer folder."""

from __future__ import annotations

import argparse

from zephon_vl.cli.registry import command


def _tokenizer_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default=None, help="folder (default: the zephon cache)")


@command("tokenizer", "build the bundled Qwen3.6 tokenizer folder and print its path",
         _tokenizer_args)
def cmd_tokenizer(args: argparse.Namespace) -> int:
    from pathlib import Path

    from zephon_core import qwen_tokenizer_dir

    print(qwen_tokenizer_dir(Path(args.out) if args.out else None))
    return 0
