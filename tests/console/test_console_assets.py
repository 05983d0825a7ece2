"""What the console ships: its vendored script as recorded, every asset inside the package,
and no markup that a strict Content-Security-Policy would block."""

from __future__ import annotations

import fnmatch
import hashlib
import re
import tomllib
from pathlib import Path

import controlplane.console

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = Path(controlplane.console.__file__).parent
STATIC = PACKAGE / "static"
TEMPLATES = PACKAGE / "templates"


def test_the_vendored_htmx_is_the_release_recorded_with_its_licence() -> None:
    record = (STATIC / "VENDORED.md").read_text()
    row = next(line for line in record.splitlines() if line.startswith("| `htmx.min.js`"))
    digest = re.search(r"`([0-9a-f]{64})`", row)
    assert digest, row
    assert hashlib.sha256((STATIC / "htmx.min.js").read_bytes()).hexdigest() == digest.group(1)
    assert "2.0.11" in row and "0BSD" in row


def test_every_template_and_asset_is_package_data() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    patterns = pyproject["tool"]["setuptools"]["package-data"]["controlplane.console"]
    shipped = [
        p for p in PACKAGE.rglob("*") if p.is_file() and p.parent.name in ("templates", "static")
    ]
    assert shipped
    for path in shipped:
        relative = path.relative_to(PACKAGE).as_posix()
        assert any(fnmatch.fnmatch(relative, p) for p in patterns), relative


def test_no_template_needs_unsafe_inline_or_another_site() -> None:
    for path in TEMPLATES.glob("*.html"):
        text = path.read_text()
        assert not re.search(r"<script(?![^>]*\bsrc=)", text), f"inline script in {path.name}"
        assert "<style" not in text, path.name
        assert not re.search(r"\sstyle=", text), f"style attribute in {path.name}"
        assert not re.search(r"\son[a-z]+=", text), f"event handler attribute in {path.name}"
        assert "javascript:" not in text, path.name
        assert not re.search(r"(src|href)=\"(https?:)?//", text), f"another site in {path.name}"
