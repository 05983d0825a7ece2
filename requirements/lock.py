"""Refreshes, or checks, the hash-pinned install locks in this directory from pyproject.toml.

`make lock` refreshes them, keeping every pin the ranges still allow; `make lock UPGRADE=1`
moves each pin to the newest release its range allows; `make lock-check` (and a test) says
whether they are current. Each lock is resolved once for every platform and every Python the
project supports (uv's universal resolution) from PyPI alone, so what a machine's own pip
configuration adds (local indexes, constraints) never reaches a lock. `dev.txt` is resolved
first; the others take their versions from it, so the three always agree.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

HERE = Path(__file__).resolve().parent
PYPROJECT = HERE.parent / "pyproject.toml"
REFRESH = "make lock"
INDEX = "https://pypi.org/simple"
INPUTS_LINE = "# pyproject inputs: sha256="

# Lock file -> the extras it installs on top of the dependencies (None: every extra).
LOCKS: dict[str, tuple[str, ...] | None] = {
    "dev.txt": None,  # make test, make lint: everything
    "run.txt": ("embedded",),  # make run: the embedded ledger vkgate up uses
    "image.txt": ("otel",),  # the container image: tracing, no chDB
}
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?==([^\s;\\]+)")


def project() -> dict[str, object]:
    return tomllib.loads(PYPROJECT.read_text())


def inputs_digest(pyproject: dict[str, object]) -> str:
    """What the locks are resolved from: a change to any of it makes them stale."""
    project_table = pyproject["project"]
    build = pyproject["build-system"]
    assert isinstance(project_table, dict) and isinstance(build, dict)
    inputs = {
        "requires-python": project_table.get("requires-python"),
        "dependencies": project_table.get("dependencies", []),
        "optional-dependencies": project_table.get("optional-dependencies", {}),
        "build-system": build.get("requires", []),
    }
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()


def refresh(*, upgrade: bool) -> None:
    pyproject = project()
    digest = inputs_digest(pyproject)
    build = "\n".join(pyproject["build-system"]["requires"]) + "\n"  # type: ignore[index]
    for name, extras in LOCKS.items():
        target = HERE / name
        command = [
            str(_uv()),
            "pip",
            "compile",
            str(PYPROJECT),
            "-",  # the build backend: an editable install of vkgate builds with it
            "--universal",
            "--python-version",
            "3.11",
            "--generate-hashes",
            "--default-index",
            INDEX,
            "--no-config",
            "--custom-compile-command",
            REFRESH,
            "--quiet",
            "--output-file",
            str(target),
        ]
        command += ["--all-extras"] if extras is None else [f"--extra={e}" for e in extras]
        if name != "dev.txt":
            command += ["--constraint", str(HERE / "dev.txt")]
        elif upgrade:
            command.append("--upgrade")
        # The command is this file's own; only the lock names vary.
        subprocess.run(command, input=build, text=True, check=True, cwd=HERE.parent)  # noqa: S603
        text = target.read_text()
        # Paths of this checkout are no part of a lock: uv names its inputs by absolute path.
        text = text.replace(str(HERE.parent) + "/", "")
        target.write_text(f"{INPUTS_LINE}{digest}\n{text}")
        print(f"requirements/{name}: {len(pins(target))} packages")


def _uv() -> Path:
    beside = Path(sys.executable).parent / "uv"
    if beside.exists():
        return beside
    raise SystemExit(f"uv is not installed beside {sys.executable}: run `make install` first")


def pins(lock: Path) -> dict[str, str]:
    """Package name (normalized) -> pinned version."""
    found = {}
    for line in lock.read_text().splitlines():
        match = _PIN.match(line)
        if match:
            found[_normalize(match.group(1))] = match.group(3)
    return found


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def problems() -> list[str]:
    """Why the locks are not current with pyproject.toml, or nothing when they are."""
    pyproject = project()
    digest = inputs_digest(pyproject)
    found = []
    for name in LOCKS:
        lock = HERE / name
        if not lock.exists():
            found.append(f"requirements/{name} is missing")
            continue
        text = lock.read_text()
        first = text.partition("\n")[0]
        if first != f"{INPUTS_LINE}{digest}":
            found.append(
                f"requirements/{name} was locked from other dependencies than pyproject.toml "
                "names now"
            )
        unhashed = [
            block.split()[0]
            for block in re.split(r"\n(?=[A-Za-z0-9])", text)
            if _PIN.match(block) and "--hash=sha256:" not in block
        ]
        if unhashed:
            found.append(f"requirements/{name} pins without a hash: {', '.join(unhashed)}")
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n")[0])
    parser.add_argument("--check", action="store_true", help="only say whether they are current")
    parser.add_argument("--upgrade", action="store_true", help="newest releases the ranges allow")
    args = parser.parse_args()
    if not args.check:
        refresh(upgrade=args.upgrade)
        return
    found = problems()
    for problem in found:
        print(problem, file=sys.stderr)
    if found:
        raise SystemExit(f"the locks are stale: run `{REFRESH}` and commit requirements/")
    print("requirements/ is current with pyproject.toml")


if __name__ == "__main__":
    main()
