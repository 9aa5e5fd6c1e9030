"""Write constraints.txt: the exact versions this repository tests with.

pyproject.toml says what the code needs (ranges); constraints.txt pins what
`scripts/setup.sh` and CI install (`pip install -c constraints.txt ...`), so the
README's two commands install the same versions on every fresh machine. This
script walks the requirements of ``zephon-vl[all]`` (read from this checkout's
pyproject.toml, not from whichever zephon-vl is installed) through the installed
distributions' metadata and pins each one at its installed version; the packages
setup.sh installs on its own (torch's CPU build, pillow-simd, TorchTitan's kernels
libraries) are added. Packages the machine has for other reasons are left out.

Usage, after a `make setup` whose versions you want to keep:
``python scripts/freeze_constraints.py > constraints.txt``; ``--check`` exits 1
when constraints.txt differs from what is installed.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
#: what setup.sh installs besides ``-e .[all]`` (see its comments for why each one)
SETUP_EXTRAS = ("torch", "pillow-simd", "triton", "fla-core", "flash-linear-attention")
HEADER = """\
# The exact versions this repository tests with (scripts/setup.sh and CI install with
# `pip install -c constraints.txt`). pyproject.toml holds the ranges a user's install
# may take. Made by `python scripts/freeze_constraints.py > constraints.txt` after a
# setup; a local version label (torch's +cpu) is left out, so any build of that
# release satisfies it. pillow-simd replaces Pillow's files after the install (setup.sh).
"""


def _pinned_version(dist: md.Distribution) -> str:
    v = Version(dist.version)
    return v.public  # 2.13.0+cpu -> 2.13.0


def _requirements(dist_name: str, extras: set[str]) -> list[Requirement]:
    dist = md.distribution(dist_name)
    out = []
    for text in dist.requires or []:
        req = Requirement(text)
        if req.marker is None or any(req.marker.evaluate({"extra": e}) for e in extras | {""}):
            out.append(req)
    return out


def _project_requirements() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = [Requirement(r) for r in project["dependencies"]]
    for group in project["optional-dependencies"].values():
        reqs += [Requirement(r) for r in group
                 if canonicalize_name(Requirement(r).name) != canonicalize_name(project["name"])]
    return [r for r in reqs if r.marker is None or r.marker.evaluate()]


def closure() -> dict[str, str]:
    """``{canonical name: installed version}`` of everything ``zephon-vl[all]`` pulls in."""
    pins: dict[str, str] = {}
    todo = [(r.name, set(r.extras)) for r in _project_requirements()]
    todo += [(name, set()) for name in SETUP_EXTRAS]
    seen: set[tuple[str, frozenset[str]]] = set()
    while todo:
        name, extras = todo.pop()
        key = (canonicalize_name(name), frozenset(extras))
        if key in seen:
            continue
        seen.add(key)
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            sys.exit(f"freeze_constraints: {name} is not installed; run `make setup` first")
        pins[canonicalize_name(dist.metadata["Name"])] = _pinned_version(dist)
        todo += [(r.name, set(r.extras)) for r in _requirements(name, extras)]
    return pins


def render(pins: dict[str, str]) -> str:
    return HEADER + "".join(f"{name}=={version}\n" for name, version in sorted(pins.items()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true",
                    help="compare with constraints.txt instead of printing")
    args = ap.parse_args()
    text = render(closure())
    if not args.check:
        sys.stdout.write(text)
        return
    have = (ROOT / "constraints.txt").read_text()
    if have != text:
        old, new = set(have.splitlines()), set(text.splitlines())
        sys.exit("constraints.txt differs from the installed versions:\n"
                 + "".join(f"  - {line}\n" for line in sorted(old - new))
                 + "".join(f"  + {line}\n" for line in sorted(new - old)))
    print("constraints.txt matches the installed versions")


if __name__ == "__main__":
    main()
