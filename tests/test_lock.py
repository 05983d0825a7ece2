"""The hash locks in requirements/: current with pyproject.toml, complete, and what each
install (`make run`, `make test`, the image) takes from them."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
LOCKS = ROOT / "requirements"
TIMEOUT_S = 60
DEV_TOOLS = ("pytest", "ruff", "mypy", "hypothesis", "uv")


def lock_pins(name: str) -> dict[str, set[Version]]:
    """Package -> the versions a lock pins (one per line; a universal lock may pin several,
    each under its own marker)."""
    pins: dict[str, set[Version]] = {}
    for line in (LOCKS / name).read_text().splitlines():
        if line[:1].isalnum() and "==" in line:
            requirement = Requirement(line.rstrip(" \\"))
            (spec,) = requirement.specifier
            pins.setdefault(canonicalize_name(requirement.name), set()).add(Version(spec.version))
    return pins


def check(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(root / "requirements" / "lock.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )


def test_the_locks_are_current_with_pyproject() -> None:
    result = check(ROOT)
    assert result.returncode == 0, result.stderr


def test_a_dependency_added_without_refreshing_the_locks_fails_the_check_naming_the_command(
    tmp_path: Path,
) -> None:
    shutil.copytree(LOCKS, tmp_path / "requirements")
    pyproject = (ROOT / "pyproject.toml").read_text()
    (tmp_path / "pyproject.toml").write_text(
        pyproject.replace("dependencies = [", 'dependencies = [\n    "jinja2>=3.1",', 1)
    )
    result = check(tmp_path)
    assert result.returncode == 1
    assert "run `make lock`" in result.stderr
    for name in ("dev.txt", "run.txt", "image.txt"):
        assert f"requirements/{name} was locked from other dependencies" in result.stderr


def test_a_pin_without_its_hash_fails_the_check(tmp_path: Path) -> None:
    shutil.copytree(LOCKS, tmp_path / "requirements")
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    lock = tmp_path / "requirements" / "image.txt"
    lines = lock.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("click=="))
    end = next(i for i in range(start + 1, len(lines)) if not lines[i].startswith("    --hash"))
    lock.write_text("\n".join([*lines[:start], lines[start].rstrip(" \\"), *lines[end:]]) + "\n")
    result = check(tmp_path)
    assert result.returncode == 1
    assert "requirements/image.txt pins without a hash: click" in result.stderr


@pytest.mark.parametrize(
    ("lock", "extras"),
    [
        ("dev.txt", ("dev", "embedded", "otel")),
        ("run.txt", ("embedded",)),
        ("image.txt", ("otel",)),
    ],
)
def test_each_lock_pins_every_dependency_of_its_install_within_its_range(
    lock: str, extras: tuple[str, ...]
) -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    wanted = [Requirement(d) for d in project["project"]["dependencies"]]
    for extra in extras:
        wanted += [Requirement(d) for d in project["project"]["optional-dependencies"][extra]]
    wanted += [Requirement(d) for d in project["build-system"]["requires"]]
    pins = lock_pins(lock)
    environment = default_environment()
    outside = [
        f"{requirement} (locked: {sorted(map(str, pins.get(canonicalize_name(requirement.name), ())))})"
        for requirement in wanted
        if requirement.marker is None or requirement.marker.evaluate(environment)
        if not any(
            v in requirement.specifier for v in pins.get(canonicalize_name(requirement.name), ())
        )
    ]
    assert not outside, f"requirements/{lock} does not satisfy: {outside}; run `make lock`"


def test_every_lock_pins_the_versions_the_development_lock_does() -> None:
    dev = lock_pins("dev.txt")
    for lock in ("run.txt", "image.txt"):
        differ = {name: v for name, v in lock_pins(lock).items() if not v <= dev.get(name, set())}
        assert not differ, f"requirements/{lock} differs from dev.txt: {differ}"


def test_running_installs_no_development_tool_and_the_image_no_embedded_ledger() -> None:
    run, image = lock_pins("run.txt"), lock_pins("image.txt")
    assert not [tool for tool in DEV_TOOLS if tool in run or tool in image]
    assert "chdb" in run
    assert "chdb" not in image
    assert "opentelemetry-sdk" in image


def make_dry_run(target: str) -> str:
    # -B: what the target would do from scratch, whatever this checkout has installed.
    result = subprocess.run(
        ["make", "--dry-run", "--always-make", target],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=True,
    )
    return result.stdout


def test_make_run_installs_the_run_lock_and_make_test_the_development_lock() -> None:
    run = make_dry_run("run")
    assert "--require-hashes -r requirements/run.txt" in run
    assert "requirements/dev.txt" not in run
    for target in ("test", "lint"):
        assert "--require-hashes -r requirements/dev.txt" in make_dry_run(target)
    # The project itself builds with the lock's setuptools, not one fetched for the build.
    assert "--no-deps --no-build-isolation -e ." in run
