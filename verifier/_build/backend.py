"""The build backend of evidence-verify (PEP 517), in the tree: it needs nothing but the
standard library, so ``pip install ./verifier`` fetches no build tool, and an examiner
without an index to hand (or a test with none) installs the verifier from the checkout
plus its two dependencies. It builds the one thing pip needs, a pure-Python wheel: the
package from ``src/``, its metadata from ``pyproject.toml``, the ``evidence-verify``
script, and the RECORD of every file's SHA-256 (PEP 427, PEP 376)."""

from __future__ import annotations

import base64
import hashlib
import tomllib
import zipfile
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent
_TAG = "py3-none-any"


def _project() -> dict:
    return tomllib.loads((_ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]


def _metadata(project: dict) -> str:
    lines = ["Metadata-Version: 2.1", f"Name: {project['name']}",
             f"Version: {project['version']}", f"Summary: {project['description']}",
             f"Requires-Python: {project['requires-python']}",
             f"License: {project['license']['text']}"]
    lines += [f"Requires-Dist: {dep}" for dep in project.get("dependencies", [])]
    readme = (_ROOT / project["readme"]).read_text(encoding="utf-8")
    lines.append("Description-Content-Type: text/markdown")
    return "\n".join(lines) + "\n\n" + readme


def _files(project: dict) -> dict[str, bytes]:
    name, version = project["name"].replace("-", "_"), project["version"]
    info = f"{name}-{version}.dist-info"
    files = {path.relative_to(_ROOT / "src").as_posix(): path.read_bytes()
             for path in sorted((_ROOT / "src").rglob("*.py"))}
    scripts = project.get("scripts", {})
    files[f"{info}/METADATA"] = _metadata(project).encode()
    files[f"{info}/WHEEL"] = (f"Wheel-Version: 1.0\nGenerator: evidence-verify _build\n"
                              f"Root-Is-Purelib: true\nTag: {_TAG}\n").encode()
    files[f"{info}/entry_points.txt"] = ("[console_scripts]\n" + "".join(
        f"{k} = {v}\n" for k, v in scripts.items())).encode()
    return files


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}\n"


def build_wheel(wheel_directory: str, config_settings: dict | None = None,
                metadata_directory: str | None = None) -> str:
    project = _project()
    name, version = project["name"].replace("-", "_"), project["version"]
    filename = f"{name}-{version}-{_TAG}.whl"
    files = _files(project)
    record = f"{name}-{version}.dist-info/RECORD"
    files[record] = ("".join(_record_line(n, d) for n, d in files.items())
                     + f"{record},,\n").encode()
    with zipfile.ZipFile(Path(wheel_directory) / filename, "w", zipfile.ZIP_DEFLATED) as zf:
        for member, data in files.items():
            info = zipfile.ZipInfo(member, date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, data)
    return filename


def get_requires_for_build_wheel(config_settings: dict | None = None) -> list[str]:
    return []


def build_sdist(sdist_directory: str, config_settings: dict | None = None) -> str:
    raise NotImplementedError("evidence-verify installs from the repository checkout "
                              "(pip install ./verifier); it has no sdist")
