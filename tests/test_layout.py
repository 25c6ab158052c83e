"""The house rules, read from the code's imports: one module per magic, small modules, arrows pointing down.

These rules are what let a newcomer find ``%whereis --watch`` in ``magics/whereis.py`` without reading
``%%cudatime``'s option splitting, and what keeps ``import torchgpu_magic`` cheap: a core module that
imported IPython (or the magics) would drag the shell into every engine and terminal entry point.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest
from conftest import ROOT

PACKAGE = ROOT / "torchgpu_magic"
MODULES = sorted(PACKAGE.rglob("*.py"))
MAX_LINES = 500
MAGICS = ("gpuinfo", "ontorch", "cudatime", "whereis", "gpumem", "cudamem")


def _dotted(path: Path) -> str:
    """``torchgpu_magic/placement/scan.py`` -> ``torchgpu_magic.placement.scan``."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    """Absolute names of every module ``path`` imports, at any depth of its code (lazy imports count)."""
    package = _dotted(path) if path.name == "__init__.py" else _dotted(path).rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            found.add(stem)
            # `from . import x` and `from .pkg import mod` name modules too
            found.update(f"{stem}.{alias.name}" for alias in node.names)
    return found


GRAPH = {_dotted(p): _imports(p) for p in MODULES}


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_module_is_under_500_lines(path):
    lines = len(path.read_text().splitlines())
    assert lines < MAX_LINES, f"{path.relative_to(ROOT)} has {lines} lines: split it by concern"


@pytest.mark.parametrize("name", MAGICS)
def test_each_magic_lives_in_the_file_named_after_it(name):
    tree = ast.parse((PACKAGE / "magics" / f"{name}.py").read_text())
    methods = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
    assert name in methods
    for other in MAGICS:
        if other != name:
            assert not any(m == other or m.startswith(f"_{other}_") for m in methods), (name, other)


# The rooms that may import IPython and the magics: the magics themselves, and the GPU check above them,
# which drives the extension through a real shell as a user does (nothing in the package imports it).
TOP_ROOMS = ("torchgpu_magic.magics", "torchgpu_magic.check")


def test_nothing_below_the_magics_imports_ipython_or_the_magics():
    for module, imported in GRAPH.items():
        if module.startswith(TOP_ROOMS) or module == "torchgpu_magic":
            continue
        upward = {m for m in imported
                  if m.split(".")[0] == "IPython" or m.startswith("torchgpu_magic.magics")}
        assert not upward, f"{module} imports {sorted(upward)}: core modules never import IPython or magics"


def test_nothing_imports_the_gpu_check():
    """The check is the top room: it imports the magics and the core, and nothing imports it."""
    for module, imported in GRAPH.items():
        if not module.startswith("torchgpu_magic.check"):
            assert not {m for m in imported if m.startswith("torchgpu_magic.check")}, module


def test_no_two_modules_of_a_package_import_each_other():
    """Within each package, sibling modules form no cycle (a shared lower module is the way to share)."""
    siblings: dict[str, set[str]] = {}
    for module, imported in GRAPH.items():
        package = module.rpartition(".")[0]
        siblings[module] = {m for m in imported
                            if m in GRAPH and m.rpartition(".")[0] == package and m != module}

    def visit(module: str, path: list[str]) -> None:
        for nxt in siblings[module]:
            assert nxt not in path, f"import cycle: {' -> '.join(path + [nxt])}"
            visit(nxt, path + [nxt])

    for module in siblings:
        visit(module, [module])


def _package_of(module: str) -> str:
    """The top-level room of ``module``: ``torchgpu_magic.gpus.nvml`` -> ``gpus``; ``torchgpu_magic.render``
    -> ``render`` (a loose module is a room of its own)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def test_no_import_circle_between_packages():
    """The rooms (``gpus``, ``timing``, ``placement``, ``gpumem``, ``holders``, ``cudamem``, ``explain``,
    ``cluster``, ``magics`` and the loose modules) form no circle either: a reader follows arrows down from
    the magics and never comes back up. Lazy imports count, since a circle of lazy imports still ties two
    rooms into one."""
    edges: dict[str, set[str]] = {}
    for module, imported in GRAPH.items():
        if module == "torchgpu_magic":
            continue
        here = _package_of(module)
        edges.setdefault(here, set()).update(
            _package_of(m) for m in imported
            if m in GRAPH and m != "torchgpu_magic" and _package_of(m) != here)

    def visit(room: str, path: list[str]) -> None:
        for nxt in edges.get(room, ()):
            assert nxt not in path, f"import circle between packages: {' -> '.join(path + [nxt])}"
            visit(nxt, path + [nxt])

    for room in edges:
        visit(room, [room])


# The floors of the house, from the top: a room imports only rooms on lower floors (lazy imports count).
# check -> magics -> cluster -> {gpumem, cudamem, explain, timing} -> holders -> placement
#        -> {gpus, devices, host} -> {accelerators, render, errors, torchapi} -> caches
# (accelerators.py, the one device layer, sits below gpus/ and devices.py, which ask it too)
FLOORS = {
    "check": 9, "__main__": 8, "magics": 7, "cluster": 6,
    "gpumem": 5, "cudamem": 5, "explain": 5, "timing": 5,
    "holders": 4, "placement": 3,
    "gpus": 2, "devices": 2, "host": 2,
    "accelerators": 1, "render": 1, "errors": 1, "torchapi": 1, "caches": 0,
}


def test_every_arrow_between_rooms_points_down_a_floor():
    """magics -> cluster -> {gpumem, cudamem, explain, timing} -> holders -> placement -> {gpus, devices,
    host} -> {accelerators, render, errors, torchapi} -> caches: a reader follows arrows down from the
    magics and never comes back up, nor sideways (``%gpumem`` loads none of ``%%cudamem``'s code)."""
    rooms = {_package_of(m) for m in GRAPH if m != "torchgpu_magic"}
    assert rooms == set(FLOORS), f"rooms without a floor: {sorted(rooms - set(FLOORS))}"
    wrong = []
    for module, imported in GRAPH.items():
        if module == "torchgpu_magic":
            continue
        here = _package_of(module)
        for target in imported:
            if target in GRAPH and target != "torchgpu_magic" and _package_of(target) != here:
                if FLOORS[_package_of(target)] >= FLOORS[here]:
                    wrong.append(f"{module} -> {target}")
    assert not wrong, "arrows that do not point down: " + ", ".join(sorted(wrong))


def test_each_magic_has_its_core_in_a_package_named_for_it():
    """A reader finds ``%gpuinfo``'s work in ``gpus/``, ``%%cudatime``'s in ``timing/``, ``%whereis``'s in
    ``placement/``, ``%gpumem``'s in ``gpumem/`` and ``holders/``, ``%%cudamem``'s in ``cudamem/`` and the
    explained errors in ``explain/``; no core module stands loose at the top but the few every room
    shares."""
    loose = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert loose == ["__init__.py", "__main__.py", "accelerators.py", "caches.py", "devices.py", "errors.py",
                     "host.py", "render.py", "torchapi.py"], loose
    for room in ("gpus", "timing", "placement", "gpumem", "holders", "cudamem", "explain", "cluster",
                 "magics"):
        assert (PACKAGE / room / "__init__.py").exists(), room


@pytest.mark.parametrize("package", sorted(p.parent for p in PACKAGE.glob("*/__init__.py")),
                         ids=lambda p: p.name)
def test_each_package_docstring_is_its_module_map(package):
    """The one map of the modules: each package's docstring names every module in it (as ``name`` or
    :mod:`.name`), and names no module that is not there."""
    import re

    doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
    modules = {p.stem for p in package.glob("*.py") if p.stem != "__init__"}
    named = set(re.findall(r"(?:``|:mod:`\.)([a-z_]+)(?:\.py)?(?:``|`)", doc))
    missing = sorted(modules - named)
    assert not missing, f"{package.name}/__init__.py's docstring does not name {missing}"
    gone = sorted(n for n in named if n not in modules and f"{n}.py" in _MODULE_LIKE)
    assert not gone, f"{package.name}/__init__.py's docstring names modules that are not there: {gone}"


# Names a docstring could use for a module that has gone (every module file name the package ever used
# here): a docstring naming one of these that does not exist in its package is out of date.
_MODULE_LIKE = {p.name for p in PACKAGE.rglob("*.py")} | {
    "tracebacks.py", "diagnosis.py", "failing.py", "oom.py", "text.py", "holdersreport.py", "tracking.py",
    "cellmem.py", "standin.py", "fakecopy.py", "targets.py", "explain.py", "dispatch.py",
}


def _private_torch_reads(path: Path) -> list:
    """Where ``path`` reaches past torch's public names: ``torch._x`` or ``torch.y._x`` attributes, imports
    from such modules, ``._cdata``, or a module name like ``'torch._x'`` in a string (aten operator names,
    ``torch.ops.aten._x``, are the op registry's public names, not private API)."""
    import re

    def chain(node: ast.AST) -> list:
        parts = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        return [node.id, *reversed(parts)] if isinstance(node, ast.Name) else []

    def private(segment: str) -> bool:
        return segment.startswith("_") and not (segment.startswith("__") and segment.endswith("__"))

    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        hit = ""
        if isinstance(node, ast.Attribute):
            names = chain(node)
            if node.attr == "_cdata":
                hit = "._cdata"
            elif names[:1] == ["torch"] and names[1:3] != ["ops", "aten"] and any(map(private, names[1:])):
                hit = ".".join(names)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            modules = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            hit = next((m for m in modules if m.split(".")[0] == "torch" and any(map(private, m.split(".")))),
                       "")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if re.fullmatch(r"torch(\.\w+)*\._\w+(\.\w+)*", node.value):
                hit = repr(node.value)
        if hit:
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {hit}")
    return found


def test_only_torchapi_reaches_torchs_private_api():
    """torch's private names (``torch._C``, ``_cdata``, ``torch.utils._python_dispatch``, MemTracker, fake
    tensors...) are read in torchapi.py alone, so a torch release that renames one breaks one function
    there, which tests/test_torchapi.py runs on every torch the legs use."""
    found = [hit for path in MODULES if path.name != "torchapi.py" for hit in _private_torch_reads(path)]
    assert not found, "torch's private API outside torchapi.py:\n" + "\n".join(found)
