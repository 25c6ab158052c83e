"""The docs cannot drift from the code (docs/development.md, "The docs cannot drift").

- Every option of every magic, read from the parser IPython keeps on the magic's function, is in the
  Options table of the magic's page, and the table names no option the parser lacks.
- Every relative link of the README and docs/ (and every link of the README into the repository)
  resolves, file and ``#anchor``.
- Every output shown in the README and docs/ is an example of docs/examples.py, and matches a run of it
  on this machine once what varies between runs is masked (``examples.mask``).
- Each magic's ``?`` help is short and ends with its page's address.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

DOCS = ROOT / "docs"
REPO = "https://github.com/torchgpu-magic/torchgpu-magic"
RAW = "https://raw.githubusercontent.com/torchgpu-magic/torchgpu-magic/main/"
# each magic's reference page
PAGES = {"gpuinfo": "gpuinfo.md", "ontorch": "ontorch.md", "cudatime": "cudatime.md", "whereis": "whereis.md",
         "gpumem": "gpumem.md", "cudamem": "cudamem.md"}
HELP_LINES = 6  # the most lines of a magic's own text in its `?` help, above the options IPython lists


def _load_examples():
    """docs/examples.py as a module (it is a script of the docs, not part of the package)."""
    spec = importlib.util.spec_from_file_location("docs_examples", DOCS / "examples.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


examples = _load_examples()


def markdown_files() -> list:
    return examples.files()


# ---- links ---------------------------------------------------------------------------------------------
def _prose(text: str) -> str:
    """A Markdown text without its code blocks, inline code and HTML comments."""
    text = re.sub(r"<!--.*?-->", "", text, flags=re.S)
    text = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    return re.sub(r"`[^`\n]*`", "", text)


def markdown_links(text: str) -> list:
    """(is_image, target) for every link and picture outside code and comments in a Markdown text."""
    text = _prose(text)
    links = [(bang == "!", target) for bang, target in
             re.findall(r"(!?)\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)", text)]
    links += [(False, target) for target in re.findall(r"^\s{0,3}\[[^\]\n]+\]:\s*<?(\S+?)>?(?:\s|$)",
                                                        text, flags=re.M)]
    links += [(tag == "img", target) for tag, target in
              re.findall(r"<(\w+)[^>]*?\s(?:src|href)=[\"']([^\"']+)", text)]
    return links


def anchors(text: str) -> set:
    """The anchors GitHub makes for a Markdown text's headings: the heading's text without Markdown,
    lower case, punctuation but ``-`` and ``_`` dropped, spaces as ``-``; a repeated one gets ``-1``,
    ``-2``..."""
    found: set = set()
    text = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    for title in re.findall(r"^#{1,6}\s+(.+?)\s*#*\s*$", text, flags=re.M):
        title = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", title).replace("`", "")
        slug = re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")
        anchor, n = slug, 0
        while anchor in found:
            n += 1
            anchor = f"{slug}-{n}"
        found.add(anchor)
    return found


def _resolve(source: Path, target: str) -> Path | None:
    """The file a link of ``source`` names (None for a link outside this repository)."""
    target = target.split("#")[0]
    if target.startswith(RAW):
        return ROOT / target[len(RAW):]
    for kind in ("blob", "tree"):
        if target.startswith(f"{REPO}/{kind}/main/"):
            return ROOT / target[len(f"{REPO}/{kind}/main/"):]
    if re.match(r"^[a-z]+:", target):
        return None
    return (source.parent / target).resolve() if target else source


def link_problems(source: Path) -> list:
    problems = []
    for _, target in markdown_links(source.read_text(encoding="utf-8")):
        path = _resolve(source, target)
        if path is None:
            continue
        if not path.exists():
            problems.append(f"{source.name}: {target}: {path} does not exist")
        elif "#" in target and path.suffix == ".md":
            anchor = target.split("#", 1)[1]
            if anchor not in anchors(path.read_text(encoding="utf-8")):
                problems.append(f"{source.name}: {target}: no heading of {path.name} makes #{anchor}")
    return problems


@pytest.mark.parametrize("name", [p.name for p in markdown_files()])
def test_links_resolve(name):
    source = next(p for p in markdown_files() if p.name == name)
    assert not link_problems(source), "\n".join(link_problems(source))


def test_docs_link_each_other_relatively():
    """A page of docs/ links to the README and to other pages relatively (GitHub and an unpacked sdist
    both show those), never through the repository's address."""
    for page in DOCS.glob("*.md"):
        absolute = [t for _, t in markdown_links(page.read_text(encoding="utf-8"))
                    if t.startswith((REPO + "/blob/", REPO + "/tree/", RAW))]
        assert not absolute, f"{page.name}: {absolute}"


def test_anchors_as_github_makes_them():
    text = "# `%%cudatime`\n## `--cluster [NAME]`\n## Out of memory: the explanation\n## Notes\n## Notes\n"
    assert anchors(text) == {"cudatime", "--cluster-name", "out-of-memory-the-explanation", "notes",
                             "notes-1"}


def test_a_broken_anchor_is_found(tmp_path):
    (tmp_path / "a.md").write_text("# A\n[b](b.md#missing) [c](b.md#there) [d](nowhere.md)\n")
    (tmp_path / "b.md").write_text("# There\n")
    problems = link_problems(tmp_path / "a.md")
    assert len(problems) == 2 and "#missing" in problems[0] and "nowhere.md" in problems[1]


# ---- options -------------------------------------------------------------------------------------------
def _magics(shell) -> dict:
    """{name: the magic's function} for every magic of the extension (line and cell)."""
    from torchgpu_magic.magics import instance

    ours = [instance(shell), *instance(shell).parts]
    return {name: func for table in shell.magics_manager.magics.values() for name, func in table.items()
            if any(getattr(func, "__self__", None) is obj for obj in ours)}


def parser_options(parser: argparse.ArgumentParser, subcommands: tuple = ()) -> set:
    """What a page must list for ``parser``: every option string, each positional by its metavar (else
    its name in capitals), and a positional naming subcommands (dest ``action``) by the subcommands."""
    names = set()
    for action in parser._actions:
        if action.option_strings:
            names.update(action.option_strings)
        elif action.dest == "action" and subcommands:
            names.update(subcommands)
        else:
            names.add(action.metavar or action.dest.upper())
    return names


def options_table(text: str) -> set:
    """The options a page's Options table names: the first word of each code span in its first column."""
    section = re.split(r"^## Options\n", text, maxsplit=1, flags=re.M)
    assert len(section) == 2, "the page has no '## Options' section"
    names = set()
    for row in re.split(r"^## ", section[1], maxsplit=1, flags=re.M)[0].splitlines():
        cells = row.split("|")
        if len(cells) < 3 or set(row) <= set("|-: ") or cells[1].strip() == "option":
            continue
        names.update(token.split()[0] for token in re.findall(r"`([^`]+)`", cells[1]))
    return names


def _subcommands(name: str) -> tuple:
    from torchgpu_magic.magics import gpumem

    return gpumem.ACTIONS if name == "gpumem" else ()


def test_every_magic_has_a_page(ip):
    assert set(_magics(ip)) == set(PAGES)
    assert all((DOCS / page).exists() for page in PAGES.values())


@pytest.mark.parametrize("name", sorted(PAGES))
def test_the_options_table_lists_every_option_and_no_other(ip, name):
    parser = _magics(ip)[name].parser
    want = parser_options(parser, _subcommands(name))
    have = options_table((DOCS / PAGES[name]).read_text(encoding="utf-8"))
    assert not want - have, f"docs/{PAGES[name]}'s Options table lacks {sorted(want - have)}"
    assert not have - want, (f"docs/{PAGES[name]}'s Options table names {sorted(have - want)}, "
                             f"which %{name} does not have")


def test_a_missing_or_stale_option_is_found():
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("spec", nargs="?")
    parser.add_argument("-q", "--quiet", action="store_true")
    parser.add_argument("--new", metavar="N")
    table = ("## Options\n\n| option | what |\n|---|---|\n| `SPEC` | a |\n| `-q`, `--quiet` | b |\n"
             "| `--old N` | c |\n")
    want, have = parser_options(parser), options_table(table)
    assert want - have == {"--new"} and have - want == {"--old"}


# ---- help ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(PAGES))
def test_help_is_short_and_points_to_the_page(ip, name):
    own = _magics(ip)[name].parser.description.strip()
    address = f"{REPO}/blob/main/docs/{PAGES[name]}"
    assert own.splitlines()[-1].strip().endswith(address), own
    assert len(own.splitlines()) <= HELP_LINES, own
    prefix = "%" if name in ip.magics_manager.magics["line"] else "%%"
    shown = re.sub(r"\x1b\[[0-9;]*m", "", ip.object_inspect_text(prefix + name))
    assert address in shown and "--" in shown  # the page, and the options IPython lists


# ---- examples ------------------------------------------------------------------------------------------
def _blocks() -> dict:
    """{example name: (file, block text)} across the README and docs/."""
    found: dict = {}
    for path in markdown_files():
        for name, body in examples.blocks(path.read_text(encoding="utf-8")).items():
            assert name not in found, f"example {name} is shown twice ({found[name][0].name}, {path.name})"
            found[name] = (path, body)
    return found


def test_every_example_is_shown_once_and_every_block_is_an_example():
    assert set(_blocks()) == set(examples.examples())


def test_the_mask_hides_figures_and_keeps_words():
    env = {"cpu": "AMD EPYC", "host": "vm"}
    run = ("%%cudatime on cpu (AMD EPYC), perf_counter (host time)\n"
           "  7.49 ms host time per loop (median; IQR 201 µs, min 3.30 ms; 31 samples x 1 loop)\n"
           "  ! noisy: IQR is 12.0 % of the median (> 10 %)\n"
           "engine 0  vm    AMD EPYC        7.03 µs      1.00x  perf_counter\n")
    other = run.replace("7.49 ms", "12.1 ms").replace("31 samples x 1 loop", "7 samples x 2 loops") \
        .replace("  ! noisy: IQR is 12.0 % of the median (> 10 %)\n", "").replace("vm  ", "ci1 ") \
        .replace("1.00x", "1.25x slower")
    assert examples.mask(run, env) == examples.mask(other, {"cpu": "AMD EPYC", "host": "ci1"})
    assert examples.mask(run, env) != examples.mask(run.replace("median", "mean"), env)
    assert examples.mask(run, env) != examples.mask(run.replace("perf_counter", "CUDA events"), env)
    freed = "the output history (Out[2], _): held 1.00 MiB on cpu; gave back "
    assert examples.mask(freed + "1.00 MiB on cpu", env) == examples.mask(freed + "nothing measurable", env)
    wrapped = "  rest   390 MiB  -  Python, libraries, and\n                    memory no name here reaches"
    assert examples.same(wrapped, wrapped.replace("and\n                    memory", "and memory\n         "),
                         env, env)
    assert not examples.same(wrapped, wrapped.replace("memory no", "no memory"), env, env)
    table = "engine    host    pid  torch\n--------  ----  -----  -----\nengine 0  vm    12632  2.13\n"
    assert examples.mask(table, env) == examples.mask(table.replace("12632", "  871"), env)
    assert examples.mask(table, env) != examples.mask(table.replace("2.13", "2.14"), env)


@pytest.fixture(scope="module")
def example_run(request) -> dict:
    """One run of docs/examples.py in a fresh interpreter (a process of its own: the examples show a
    session from its first cell, and the test session's shell is not theirs)."""
    if getattr(request.config, "_simulated_machine", None) is not None:
        pytest.skip("the examples run in a process of their own, which the simulated machine does not reach: "
                    "the ordinary leg compares them")
    here = examples.environment()
    why = {examples.differs(examples.written_env(p.read_text(encoding="utf-8")), here)
           for p, _ in _blocks().values()}
    if None not in why:
        pytest.skip("; ".join(sorted(why)) + ": they are compared on a machine like that one")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH"))
                                                     if p))
    proc = subprocess.run([sys.executable, str(DOCS / "examples.py"), "--json"], capture_output=True,
                          text=True, timeout=900, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return json.loads(proc.stdout)


@pytest.mark.parametrize("name", sorted(examples.examples()))
def test_example_matches_a_run(example_run, name):
    path, body = _blocks()[name]
    written = examples.written_env(path.read_text(encoding="utf-8"))
    why = examples.differs(written, example_run["env"], examples.examples()[name][1].depends)
    if why:
        pytest.skip(why)
    run = example_run["outputs"][name]
    want, got = examples.mask(body, written), examples.mask(run, example_run["env"])
    assert examples.same(body, run, written, example_run["env"]), (
        f"{path.name}'s example {name} no longer matches a run: `python docs/examples.py --write` rewrites "
        f"it\n--- {path.name}\n{want}\n--- this run\n{got}")
