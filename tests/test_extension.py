"""Load / unload / reload through a real InteractiveShell, and the cost of `import torchgpu_magic`."""
from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import ROOT

OUR_MAGICS = {"gpuinfo", "ontorch", "cudatime", "whereis", "gpumem", "cudamem"}


def _ours(shell):
    found = set()
    for table in shell.magics_manager.magics.values():
        found |= OUR_MAGICS & set(table)
    return found


@pytest.mark.fresh_process
def test_import_is_light():
    code = (
        "import sys, torchgpu_magic\n"
        "heavy = [m for m in ('torch', 'pynvml', 'ipywidgets', 'IPython', 'psutil') if m in sys.modules]\n"
        "print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


@pytest.mark.fresh_process
def test_loading_imports_only_the_magics():
    """`%load_ext` registers the magics and nothing else: the core (placement, timing, inventory, memory,
    cluster...), torch, pynvml and ipywidgets wait for a magic's first use, so loading stays cheap."""
    code = (
        "import sys\n"
        "from IPython.core.interactiveshell import InteractiveShell\n"
        "InteractiveShell.instance().run_line_magic('load_ext', 'torchgpu_magic')\n"
        "ours = {'torchgpu_magic', 'torchgpu_magic.errors'}\n"
        "print(','.join(sorted(m for m in sys.modules if m.startswith('torchgpu_magic')\n"
        "                      and m not in ours and not m.startswith('torchgpu_magic.magics'))\n"
        "               + [m for m in ('torch', 'pynvml', 'ipywidgets', 'psutil') if m in sys.modules]))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


@pytest.mark.fresh_process
def test_each_magics_module_is_imported_at_its_first_use_not_at_load():
    """`%load_ext` registers a stand-in per magic; a magic's module is compiled and run when the magic is
    first used or asked about (its help is the real one), and never by `%unload_ext`."""
    code = (
        "import sys\n"
        "from IPython.core.interactiveshell import InteractiveShell\n"
        "shell = InteractiveShell.instance()\n"
        "mods = lambda: sorted(m.rsplit('.', 1)[1] for m in sys.modules\n"
        "                      if m.startswith('torchgpu_magic.magics.')\n"
        "                      and m.rsplit('.', 1)[1] not in ('base', 'shell', 'explainers'))\n"
        "shell.run_line_magic('load_ext', 'torchgpu_magic')\n"
        "print('loaded', mods())\n"
        "shell.run_line_magic('unload_ext', 'torchgpu_magic')\n"
        "print('unloaded', mods())\n"
        "shell.run_line_magic('load_ext', 'torchgpu_magic')\n"
        "shell.run_line_magic('ontorch', '')\n"
        "print('used', mods())\n"
        "doc = shell.find_cell_magic('cudatime').__doc__\n"
        "print('help', 'docs/cudatime.md' in doc)\n"
        "print('after', mods(), shell.find_cell_magic('cudatime').__self__.__class__.__name__)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    lines = out.stdout.splitlines()
    assert lines[0] == "loaded []" and lines[1] == "unloaded []"
    assert lines[3] == "used ['ontorch']"
    assert lines[4] == "help True"  # the real docstring
    assert lines[5] == "after ['cudatime', 'ontorch'] CUDATimeMagics"


def test_whereis_help_states_the_default_top():
    from torchgpu_magic.magics.whereis import WhereIsMagics
    from torchgpu_magic.placement import DEFAULT_TOP

    [top] = [a for a in WhereIsMagics.whereis.parser._actions if a.dest == "top"]
    assert f"(default {DEFAULT_TOP})" in top.help


def test_load_registers_all_magics(ip):
    assert _ours(ip) == OUR_MAGICS


def test_reload_many_times_keeps_one_registration(ip):
    from torchgpu_magic.magics import instance

    for _ in range(100):
        ip.run_line_magic("reload_ext", "torchgpu_magic")
    assert _ours(ip) == OUR_MAGICS
    assert sum(1 for name in ip.magics_manager.registry if name == "TorchGPUMagics") == 1
    assert instance(ip) is not None


def test_load_twice_registers_once_and_unload_removes_all(ip):
    import torchgpu_magic

    closers_before = len(ip.magics_manager.registry["TorchGPUMagics"]._closers)
    torchgpu_magic.load_ipython_extension(ip)
    assert len(ip.magics_manager.registry["TorchGPUMagics"]._closers) == closers_before
    torchgpu_magic.unload_ipython_extension(ip)
    assert _ours(ip) == set()
    assert "TorchGPUMagics" not in ip.magics_manager.registry
    torchgpu_magic.unload_ipython_extension(ip)  # idempotent
    torchgpu_magic.load_ipython_extension(ip)
    assert _ours(ip) == OUR_MAGICS


def test_unload_restores_shell_hooks(ip):
    import torchgpu_magic

    def snapshot():
        events = {name: list(cbs) for name, cbs in ip.events.callbacks.items()}
        formatters = {
            key: (dict(f.type_printers), dict(f.deferred_printers))
            for key, f in ip.display_formatter.formatters.items()
        }
        return events, formatters, ip.CustomTB, ip.custom_exceptions

    torchgpu_magic.unload_ipython_extension(ip)
    clean = snapshot()
    for _ in range(3):
        torchgpu_magic.load_ipython_extension(ip)
        ip.run_line_magic("whereis", "--watch on")
        ip.run_line_magic("whereis", "--repr on")
        torchgpu_magic.unload_ipython_extension(ip)
        assert snapshot() == clean
    torchgpu_magic.load_ipython_extension(ip)
