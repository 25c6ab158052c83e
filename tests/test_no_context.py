"""No CUDA context behind the user's back (issue 11, item 7; issue 19, item 1), on a real GPU: each step a
user may take without asking for the GPU runs in a fresh process, which must then hold no primary context
on any GPU and appear in no NVML process list. A context costs hundreds of MiB on every GPU it lands on."""
from __future__ import annotations

import pytest
from fresh_process import run_fresh

STEPS = {
    "load the extension": "pass",
    "%gpuinfo": "cell('%gpuinfo')",
    "%gpuinfo --json -i 0": "cell('%gpuinfo --json -i 0')",
    "%gpumem's sampler": "import time\ncell('%gpumem --widget --interval 0.05')\ncell('y = [1] * 10')\n"
                         "time.sleep(1)\ncell('%gpumem stop')",
    "%whereis on cpu tensors": "cell('t = torch.ones(4)\\nm = torch.nn.Linear(2, 2)')\ncell('%whereis')\n"
                               "cell('%whereis t m')",
    "%%ontorch cpu": "cell('%%ontorch cpu\\nz = torch.ones(3) + 1')",
    "%%cudatime on a cpu cell": "cell('%%cudatime -r 3 --max-time 1\\ntorch.ones(8) * 2')",
    "%cudatime --kernels on a cpu statement":
        "cell('%cudatime -r 3 --max-time 1 --kernels torch.ones(8) * 2')",
    "%%cudatime on a cpu cell after CUDA was initialised":  # issue 19: initialised is not 'used the GPU'
        "torch.cuda.init()\nr = cell('%cudatime -o -q -r 3 --max-time 1 torch.ones(8) * 2')\n"
        "assert r.device == 'cpu', r.device",
    # issue 28, item 4: fake CUDA tensors would run torch.empty(1, device='cuda'); the prediction stands in
    # on cpu, its autocast probe uses CUDA-shaped tensors without data, and it reads the GPU's generation
    "%%cudamem --predict cuda (autocast, attention, backward)":
        "cell('m = torch.nn.MultiheadAttention(64, 4, dropout=0.1, batch_first=True)\\n"
        "x = torch.randn(2, 32, 64)')\n"
        "r = cell('%%cudamem --predict cuda -o -q\\nwith torch.autocast(\"cuda\", dtype=torch.bfloat16):\\n"
        "    y, _ = m(x, x, x, need_weights=False)\\ny.float().sum().backward()')\n"
        "assert not r.how.startswith('FakeTensorMode on fake cuda'), r.how",
}


@pytest.mark.gpu
@pytest.mark.parametrize("step", list(STEPS))
def test_gpu_a_step_that_does_not_use_the_gpu_creates_no_context(step):
    done = run_fresh(STEPS[step] + "\nprint('CONTEXTS', contexts(), 'NVML', nvml_pids())\n")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "CONTEXTS [] NVML []" in done.stdout, done.stdout[-2000:]
