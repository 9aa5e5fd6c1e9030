"""The original Zephon (``zephon`` 0.2.0 on PyPI) as a throughput peer on the text workload.

It runs in its own virtual environment, built once under zephon's cache with
``pip install zephon==0.2.0`` and the exact transformers and tokenizers versions
of the running environment (the same tokenizer build, so the ids can only differ
by settings); it is never a dependency of zephon-vl. The pipeline is
``peer_text_driver.py`` (beside this file), run by the peer's interpreter.

Settings that make it do the same work as zephon-vl (issue 39): a copy of the
tokenizer folder whose ``tokenizer_config.json`` says ``split_special_tokens: true``
(zephon-vl never turns text into control tokens; docs/peer-zephon.md shows the ids
are then equal), ``decode_text(normalize_newlines=False)``, EOS appended and no BOS,
and a `StaticMixtureWorkSource` ``chunk_size`` small enough that every one of the 8
lanes gets chunks early (its default, 16,384 samples a chunk, is more than a lane's
share of a benchmark-sized dataset).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from zephon_core.extend import cache_dir

PEER_VERSION = "0.2.0"
#: packages the peer shares with zephon-vl, installed at the running environment's versions
PINNED = ("transformers", "tokenizers")
DRIVER = Path(__file__).with_name("peer_text_driver.py")


def peer_python(cache: Path | None = None) -> Path:
    """The peer's interpreter, in a virtual environment built once (needs PyPI then)."""
    cache = cache or cache_dir() / f"peer-zephon-{PEER_VERSION}"
    python = cache / "venv" / "bin" / "python"
    ready = cache / "ready"
    if ready.is_file() and python.is_file():
        return python
    shutil.rmtree(cache / "venv", ignore_errors=True)
    cache.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", str(cache / "venv")], check=True)
    pins = [f"{p}=={metadata.version(p)}" for p in PINNED]
    subprocess.run([str(python), "-m", "pip", "install", "-q", f"zephon=={PEER_VERSION}",
                    *pins], check=True)
    ready.write_text(f"zephon=={PEER_VERSION} {' '.join(pins)}\n")
    return python


def split_special_copy(tokenizer: Path, work: Path) -> Path:
    """A copy of the tokenizer folder whose config turns `split_special_tokens` on: the peer
    loads a tokenizer by folder, so this is how it gets the setting zephon-vl uses."""
    copy = work / "tokenizer-split-special"
    if not (copy / "tokenizer.json").is_file():
        shutil.copytree(tokenizer, copy, dirs_exist_ok=True)
        config_path = copy / "tokenizer_config.json"
        config = json.loads(config_path.read_text())
        config["split_special_tokens"] = True
        config_path.write_text(json.dumps(config, indent=2))
    return copy


def run_peer(job: dict, python: Path, work: Path) -> dict:
    """Run the driver on `job` in the peer's interpreter; its result (`peer_text_driver`)."""
    job = {**job, "out": str(work / f"peer-{os.getpid()}.json")}
    path = work / f"peer-job-{os.getpid()}.json"
    path.write_text(json.dumps(job))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["HF_HUB_OFFLINE"] = "1"
    subprocess.run([str(python), str(DRIVER), str(path)], check=True, env=env, cwd=work)
    return json.loads(Path(job["out"]).read_text())
