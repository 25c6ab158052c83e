"""What would be published: the wheel's contents and metadata, the sdist's docs, a build without
warnings, and a README whose links work on a package index page and reach every reference page.

The wheel and the sdist are built once each, by setuptools' own PEP 517 backend (the one pyproject.toml
names) in a fresh interpreter, from a copy of the source tree, so the repository gets no build/ or
egg-info of its own.
``make dist`` does the full isolated build and ``twine check``; this is the quick guard that runs with
every ``make test``.
"""
from __future__ import annotations

import email
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import ROOT
from test_docs import markdown_links

SKIP_ANYWHERE = {".git", "__pycache__", ".pytest_cache", ".ruff_cache", ".hypothesis", ".ipynb_checkpoints"}
SKIP_AT_TOP = {"build", "dist", ".whl", "test-artifacts"}
# one build per interpreter: setuptools keeps state between two builds in one process (the second's file
# is left in a temporary directory)
BUILD = """
import sys
from setuptools import build_meta
print("BUILT=" + getattr(build_meta, sys.argv[2])(sys.argv[1]))
"""


def _not_source(directory: str, names: list) -> list:
    """copytree's filter: venvs, caches and build outputs are not part of the source tree."""
    top = Path(directory) == ROOT
    return [n for n in names if n in SKIP_ANYWHERE or n.endswith(".egg-info")
            or (top and (n in SKIP_AT_TOP or n.startswith(".venv")))]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple:
    """(the wheel's path, everything the build printed, the sdist's path)."""
    tmp = tmp_path_factory.mktemp("packaging")
    src, out = tmp / "src", tmp / "out"
    shutil.copytree(ROOT, src, ignore=_not_source)
    out.mkdir()
    # a real build byte-compiles; with PYTHONDONTWRITEBYTECODE set, setuptools warns that it does not
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    built, printed = [], ""
    for hook in ("build_wheel", "build_sdist"):
        proc = subprocess.run([sys.executable, "-c", BUILD, str(out), hook], cwd=src, env=env,
                              capture_output=True, text=True, timeout=300)
        printed += proc.stdout + proc.stderr
        assert proc.returncode == 0, printed[-3000:]
        built.append(out / re.search(r"^BUILT=(.+)$", proc.stdout, re.M).group(1))
    return built[0], printed, built[1]


@pytest.fixture(scope="module")
def metadata(built: tuple) -> email.message.Message:
    """The wheel's METADATA (core metadata: what a package index shows)."""
    with zipfile.ZipFile(built[0]) as wheel:
        name = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
        return email.message_from_string(wheel.read(name).decode("utf-8"))


def test_build_prints_no_warning(built: tuple) -> None:
    warnings = [line for line in built[1].splitlines() if "warn" in line.lower()]
    assert not warnings, "\n".join(warnings)


def test_wheel_holds_the_package_and_nothing_else(built: tuple) -> None:
    with zipfile.ZipFile(built[0]) as wheel:
        names = set(wheel.namelist())
    dist_info = {n for n in names if n.split("/")[0].endswith(".dist-info")}
    package = {p.relative_to(ROOT).as_posix() for p in (ROOT / "torchgpu_magic").rglob("*.py")
               if "__pycache__" not in p.parts}
    assert "torchgpu_magic/__init__.py" in package
    assert names - dist_info == package
    assert {n.split("/", 1)[1] for n in dist_info} >= {"METADATA", "RECORD", "WHEEL", "licenses/LICENSE"}


def test_metadata_license_and_description(metadata: email.message.Message) -> None:
    assert metadata["License-Expression"] == "MIT"
    assert metadata.get_all("License-File") == ["LICENSE"]
    assert metadata["License"] is None  # the old free-text field, which setuptools deprecates
    assert metadata["Description-Content-Type"] == "text/markdown"
    assert metadata.get_payload().strip() == (ROOT / "README.md").read_text(encoding="utf-8").strip()


def test_readme_links_work_on_a_package_index(metadata: email.message.Message) -> None:
    """Relative links and in-page anchors break on a package index page, and a picture must be the
    raw file, not GitHub's page about it; links into the repository must name files that exist."""
    urls = dict(u.split(", ", 1) for u in metadata.get_all("Project-URL"))
    repo = urls["Repository"].rstrip("/")
    raw = repo.replace("https://github.com/", "https://raw.githubusercontent.com/", 1) + "/main/"
    links = markdown_links((ROOT / "README.md").read_text(encoding="utf-8"))
    assert any(is_image for is_image, _ in links), "the README shows no picture"
    problems = []
    for is_image, target in links:
        path = None
        if not target.startswith(("https://", "http://")):
            problems.append(f"{target}: not an absolute address")
            continue
        if target.startswith(raw):
            path = target[len(raw):]
        elif target.startswith((f"{repo}/blob/main/", f"{repo}/tree/main/")):
            path = target.split("/main/", 1)[1]
            if is_image:
                problems.append(f"{target}: a picture must be {raw}..., not GitHub's page about the file")
        elif target.startswith(f"{repo}/"):
            problems.append(f"{target}: a file of this repository must be {repo}/blob/main/PATH")
        if path is not None and not (ROOT / path.split("#")[0]).exists():
            problems.append(f"{target}: {path} is not in the repository")
    assert not problems, "\n".join(problems)


def test_readme_link_finder() -> None:
    text = ("See [a](https://x/a) and ![p](docs/p.png \"title\").\n"
            "```\n[not](a-link)\n```\n`[nor](this)`\n[ref]: https://x/ref\n<img src=\"https://x/i.png\">\n"
            "<!-- [nor](a comment) -->\n")
    assert markdown_links(text) == [(False, "https://x/a"), (True, "docs/p.png"), (False, "https://x/ref"),
                                    (True, "https://x/i.png")]


def test_readme_links_every_reference_page() -> None:
    """The README is the index: each page of docs/ is one link away, at the address that works on a
    package index."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    targets = {t.split("#")[0] for _, t in markdown_links(readme)}
    repo = "https://github.com/torchgpu-magic/torchgpu-magic/blob/main/"
    missing = [p.name for p in sorted((ROOT / "docs").glob("*.md")) if repo + f"docs/{p.name}" not in targets]
    assert not missing, f"the README links to no {missing}"


def test_sdist_ships_the_docs_and_not_the_tests(built: tuple) -> None:
    """The README's reference pages link to each other relatively: in an unpacked sdist they must all be
    there, with their pictures (MANIFEST.in's graft docs); the tests are not (prune tests)."""
    import tarfile

    with tarfile.open(built[2]) as sdist:
        names = {n.split("/", 1)[1] for n in sdist.getnames() if "/" in n}
    docs = {p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").rglob("*")
            if p.is_file() and "__pycache__" not in p.parts}
    assert docs <= names, sorted(docs - names)
    assert not [n for n in names if n.startswith("tests/")]


def test_no_tracked_file_is_ignored() -> None:
    """A .gitignore pattern that matches a tracked file hides its next copies from `git status`."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    ignored = subprocess.run(["git", "ls-files", "--cached", "--ignored", "--exclude-standard"], cwd=ROOT,
                             capture_output=True, text=True, check=True).stdout.split()
    assert ignored == []
