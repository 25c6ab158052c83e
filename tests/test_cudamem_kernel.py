"""No path of %%cudamem can kill the process: every form (measured, --predict for cpu and cuda, --fit, cells
that move tensors to cuda in every way torch allows, cells fake tensors cannot run, bad options) runs in a
real Jupyter kernel (nbclient) and in a fresh Python process, which must both survive. On this CPU-only
torch a fake cuda tensor's first autograd op aborts the process, as a test shows in a process of its own;
%%cudamem never makes one. Also in fresh processes: a torch without MemTracker (one line), and a
torch.cuda scripted to answer as an H100 (the prediction still runs on cpu, with the H100's capacity)."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest
from conftest import ROOT

SETUP = ("import os, torch, torch.nn.functional as F\n"
         "model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.Dropout(0.1), "
         "torch.nn.Linear(128, 8))\nopt = torch.optim.AdamW(model.parameters())\nx = torch.randn(32, 64)\n"
         "def step(batch):\n    loss = model(batch).square().mean()\n"
         "    loss.backward(); opt.step(); opt.zero_grad()\n    return loss")
CUDA_CELLS = [
    "model.cuda(); xb = x.cuda(); step(xb)",
    "dev = torch.device('cuda'); model.to(dev); model(x.to(dev)).sum().backward()",
    "z = torch.randn(16, 64, device='cuda', requires_grad=True); model.cuda()(z).sum().backward()",
    "z = torch.zeros(16, 64, device=0); model.cuda()(z).sum().backward()",
    "z = x.to(0, non_blocking=True); model.cuda()(z).sum().backward()",
    "with torch.autocast('cuda', dtype=torch.bfloat16):\n    y = model.cuda()(x.cuda())\n"
    "y.float().sum().backward()",
    "with torch.cuda.amp.autocast():\n    y = model(x)\ny.float().sum().backward()",
    "torch.set_default_device('cuda')\nz = torch.randn(4, 64, requires_grad=True)\nmodel(z).sum().backward()",
    "with torch.device('cuda'):\n    z = torch.randn(4, 64, requires_grad=True)\nmodel(z).sum().backward()",
    "y = x.new_zeros(3, 64, device='cuda', requires_grad=True); model(y).sum().backward()",
    "y = torch.empty_like(x, device='cuda').requires_grad_(); model(y).sum().backward()",
    "q = torch.randn(2, 4, 16, 8, device='cuda', requires_grad=True)\n"
    "F.scaled_dot_product_attention(q, q, q, dropout_p=0.1, is_causal=True).sum().backward()",
    "s = torch.amp.GradScaler('cuda'); l = model(x).sum(); s.scale(l).backward(); s.step(opt); s.update()",
    "t = torch.tensor([1.0, 2.0], device='cuda', requires_grad=True); (t * 2).sum().backward()",
    "t = torch.arange(10., device=torch.device('cuda', 0), requires_grad=True); (t * 2).sum().backward()",
    "model.to('cuda:0', torch.bfloat16); model(x.to('cuda:0', torch.bfloat16)).float().sum().backward()",
]
FAILING_CELLS = [
    "loss = model(x).sum(); print(loss.item())",
    "y = model(x).sum(); torch.cuda.synchronize()",
    "x = (",
    "(x > 0).nonzero()",
]


def _cases(cuda_capacity_known: bool) -> list:
    """(line of %%cudamem, cell body, whether it must fail) for every path, in a process whose torch does
    (or does not) know a CUDA device's capacity: the kernel's and the fresh process's, not this one's, which
    may be the simulated GPU's."""
    cases = [("", "step(x)", False), ("cpu", "step(x)", False), ("cuda", "step(x)", True)]
    cases += [("--predict cuda -q", cell, False) for cell in CUDA_CELLS]
    # for cpu, a cell that puts tensors on cuda is refused; torch.cuda.amp.autocast and GradScaler('cuda')
    # disable themselves on a torch without CUDA, as in a real run
    keeps_to_cpu = ("torch.cuda.amp.autocast()", "GradScaler('cuda')")
    cases += [("--predict cpu -q", cell, not any(k in cell for k in keeps_to_cpu)) for cell in CUDA_CELLS]
    cases += [(f"--predict {d} -q", cell, True) for cell in FAILING_CELLS for d in ("cpu", "cuda")]
    cases += [("--fit x --capacity 64MiB -q", "step(x)", False),
              ("--fit x --predict cpu --capacity 64MiB -q", "step(x)", False),
              ("--fit x -q", "step(x)", not cuda_capacity_known),
              ("--capacity nonsense", "step(x)", True), ("--predict --arch z80", "step(x)", True),
              ("--predict tpu", "step(x)", True), ("--fit opt --capacity 1GiB", "step(x)", True),
              ("--predict cuda -q", "%whereis\nstep(x)", True), ("-q", "raise KeyError('the cell')", True)]
    return cases


CAPACITY_KNOWN = "torch.cuda.is_available() and torch.cuda.device_count() > 0"


@pytest.mark.notebook
def test_every_path_survives_in_a_real_kernel():
    pytest.importorskip("nbclient", reason="needs nbclient and nbformat (the IPython 7 leg has neither)")
    import nbformat
    from nbclient import NotebookClient

    spec = importlib.util.spec_from_file_location("notebook_runner", ROOT / "notebooks" / "run.py")
    runner = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(runner)
    cases = _cases(False)  # the same cells either way; the kernel's own answer sets what is expected
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("%load_ext torchgpu_magic\n" + SETUP +
                                          f"\nprint(os.getpid(), bool({CAPACITY_KNOWN}))")]
    nb.cells += [nbformat.v4.new_code_cell(f"%%cudamem {line}\n{body}") for line, body, _ in cases]
    nb.cells.append(nbformat.v4.new_code_cell("print(os.getpid()); step(x); print('alive')"))
    with runner.this_python_kernel() as kernel:
        client = NotebookClient(nb, kernel_name=kernel, timeout=300, allow_errors=True,
                                resources={"metadata": {"path": str(ROOT)}})
        client.execute()  # a dead kernel raises DeadKernelError here
    pid, known = runner.cell_text(nb.cells[0]).split()[:2]
    assert runner.cell_text(nb.cells[-1]).split()[0] == pid and "alive" in runner.cell_text(nb.cells[-1])
    for cell, (line, body, fails) in zip(nb.cells[1:-1], _cases(known == "True")):
        errors = [o for o in cell.outputs if o.output_type == "error"]
        usage = [o.text for o in cell.outputs
                 if o.output_type == "stream" and o.text.startswith("UsageError:")]
        assert bool(errors or usage) == fails, (line, body, errors, usage)
        for text in usage:  # IPython shows a UsageError as one line on stderr, no traceback
            assert text.count("\n") <= 1 and "Traceback" not in text


def _fresh(code: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout,
                          env=env, cwd=str(ROOT))


_SHELL = ("from IPython.core.interactiveshell import InteractiveShell\n"
          "ip = InteractiveShell.instance()\nip.run_line_magic('load_ext', 'torchgpu_magic')\n")


@pytest.mark.fresh_process
def test_every_path_survives_in_a_fresh_process():
    code = (_SHELL + f"r = ip.run_cell({SETUP!r}); r.raise_error()\nimport torch\n"
            f"cases = {_cases(True)!r} if {CAPACITY_KNOWN} else {_cases(False)!r}\n"
            "for line, body, fails in cases:\n"
            "    r = ip.run_cell('%%cudamem ' + line + '\\n' + body)\n"
            "    error = r.error_before_exec or r.error_in_exec\n"
            "    assert (error is not None) == fails, (line, body, error)\n"
            "ip.run_cell('step(x)').raise_error()\nprint('SURVIVED')\n")
    done = _fresh(code)
    assert done.returncode == 0 and "SURVIVED" in done.stdout, done.stderr[-3000:]


def _cuda_build() -> bool:
    import torch

    return bool(getattr(torch._C, "_has_cuda", False)) and torch.version.cuda is not None


@pytest.mark.fresh_process
@pytest.mark.skipif(_cuda_build(), reason="a CUDA build runs fake cuda tensors")
def test_the_hazard_is_real_a_fake_cuda_tensors_first_autograd_op_aborts_this_torch():
    """Why %%cudamem stands cpu in for cuda here: the same step on fake cuda tensors kills the process."""
    done = _fresh("import torch\nfrom torch._subclasses.fake_tensor import FakeTensorMode\n"
                  "with FakeTensorMode():\n    t = torch.empty(4, device='cuda', requires_grad=True)\n"
                  "    (t * 2).sum().backward()\nprint('survived')\n", timeout=120)
    assert done.returncode != 0 and "survived" not in done.stdout


@pytest.mark.fresh_process
def test_a_torch_without_memtracker_gets_one_line():
    code = ("import sys\nsys.modules['torch.distributed._tools.mem_tracker'] = None\n" + _SHELL +
            "ip.run_cell('import torch\\nx = torch.ones(3)')\n"
            "for line in ('', '--predict cpu'):\n"
            "    r = ip.run_cell('%%cudamem ' + line + '\\nx * 2')\n"
            "    print(type(r.error_in_exec).__name__, '|', r.error_in_exec)\n")
    done = _fresh(code, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 2 and all(line.startswith("UsageError | %%cudamem: this torch") for line in lines)
    assert all("has no MemTracker" in line and "tested with 2.11, 2.12, 2.13" in line for line in lines)


@pytest.mark.fresh_process
def test_torch_cuda_scripted_as_an_h100_still_predicts_on_cpu_with_its_capacity():
    """As a harness that makes torch.cuda answer like an H100 on this machine (issue 19's
    --simulate-gpu): the prediction takes the H100's capacity and generation, and runs on cpu."""
    code = ("import torch\n"
            "class Props:\n"
            "    total_memory, name, major, minor = 85_520_809_984, 'NVIDIA H100 80GB HBM3', 9, 0\n"
            "torch.cuda.is_available = lambda: True\ntorch.cuda.device_count = lambda: 1\n"
            "torch.cuda.get_device_properties = lambda index=None: Props()\n" + _SHELL +
            f"ip.run_cell({SETUP!r}).raise_error()\n"
            "r = ip.run_cell('%%cudamem --predict cuda -o -q\\nmodel.cuda(); step(x.cuda())')\n"
            "r.raise_error()\n"
            "rep = r.result\n"
            "print(rep.capacity, rep.fits, rep.categories['workspaces'], 'standing in' in rep.how)\n")
    done = _fresh(code, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    capacity, fits, workspaces, stand_in = done.stdout.split()[-4:]
    if _cuda_build():
        pytest.skip("a CUDA build may run this natively")
    # the cuBLAS workspaces of the cell's thread and of autograd's, 32 MiB each on sm_90 (issue 28)
    assert (capacity, fits, workspaces, stand_in) == ("85520809984", "True", str(64 * 2**20), "True")
