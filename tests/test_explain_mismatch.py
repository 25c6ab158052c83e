"""explain/mismatch.py on CPU with `meta`: torch's mismatch wordings, real errors, the diagnosis."""
from __future__ import annotations

import gc
import weakref

import pytest
import torch
import torch.nn.functional as F
from device_error_wordings import WORDINGS

from torchgpu_magic.explain import mismatch as placement_diagnosis


def _raise(fn):
    try:
        fn()
    except RuntimeError as exc:
        return exc
    raise AssertionError("did not raise")


@pytest.mark.parametrize("message, devices", [
    ("Expected all tensors to be on the same device, but found at least two devices, cpu and meta!",
     ("cpu", "meta")),
    ("Expected all tensors to be on the same device, but got mat2 is on cuda:0, different from other "
     "tensors on cpu (when checking argument in method wrapper_CUDA_mm)", ("cuda:0", "cpu")),
    ("Expected object of type torch.cuda.FloatTensor but found type torch.FloatTensor for argument #2 'mat2'",
     ("cuda", "cpu")),
    ("Expected object of device type cuda but got device type cpu for argument #1 'self'", ("cuda", "cpu")),
    ("Input type (torch.FloatTensor) and weight type (torch.cuda.FloatTensor) should be the same",
     ("cpu", "cuda")),
    ("Tensor on device meta is not on the expected device cpu!", ("meta", "cpu")),
])
def test_mismatch_wordings(message, devices):
    assert placement_diagnosis.mismatch_devices(RuntimeError(message)) == devices


@pytest.mark.parametrize("message, expected, source", WORDINGS,
                         ids=[f"w{i:02d}" for i in range(len(WORDINGS))])
def test_every_wording_in_the_table(message, expected, source):
    """Every wording PyTorch has used (tests/device_error_wordings.py, each with where it came from),
    and the dtype / shape errors that look alike and must get no device diagnosis."""
    assert placement_diagnosis.mismatch_devices(RuntimeError(message)) == expected, source


def test_the_table_has_both_kinds_of_rows():
    positives = [row for row in WORDINGS if row[1] is not None]
    assert len(positives) >= 60 and len(WORDINGS) - len(positives) >= 10


def test_sdpa_python_check_is_a_value_error():
    """torch/nn/attention/_utils.py raises the SDPA device check as a ValueError; other ValueErrors
    with mismatch-like text stay unrecognised."""
    message = ("Expected query, key, and value to have the same device type, but got query.device: cpu, "
               "key.device: meta, and value.device: meta instead.")
    assert placement_diagnosis.mismatch_devices(ValueError(message)) == ("cpu", "meta")
    assert placement_diagnosis.mismatch_devices(TypeError(message)) is None


@pytest.mark.parametrize("exc", [
    RuntimeError("Input type (torch.cuda.HalfTensor) and weight type (torch.cuda.FloatTensor) "
                 "should be the same"),
    RuntimeError("mat1 and mat2 shapes cannot be multiplied (2x3 and 4x5)"),
    ValueError("Expected all tensors to be on the same device"),
])
def test_not_a_mismatch(exc):
    assert placement_diagnosis.mismatch_devices(exc) is None


def test_real_errors_are_recognised():
    a, b = torch.ones(3), torch.ones(3, device="meta")
    model = torch.nn.Linear(3, 2).to("meta")
    errors = [
        _raise(lambda: a + b),
        _raise(lambda: model(torch.ones(1, 3))),
        _raise(lambda: torch.ones(3, 3) @ b),
        _raise(lambda: F.linear(torch.ones(2, 3), torch.ones(4, 3, device="meta"),
                                torch.ones(4, device="meta"))),
    ]
    for exc in errors:
        assert placement_diagnosis.mismatch_devices(exc) is not None, str(exc)


def test_diagnosis_keeps_no_reference():
    x = torch.ones(3)
    ns = {"x": x, "y": torch.ones(3, device="meta")}
    exc = _raise(lambda: ns["x"] + ns["y"])
    diagnosis = placement_diagnosis.diagnose(exc, "z = x + y", ns, lambda filename: False)
    assert {c.name for c in diagnosis.culprits} == {"x", "y"}
    assert diagnosis.fixes == ["x = x.to(y.device)"]
    ref = weakref.ref(x)
    del ns["x"], x, exc
    gc.collect()
    assert ref() is None
    assert "x" in diagnosis.to_text() and diagnosis.to_dict()["fixes"]


def test_diagnosis_of_a_cell_that_also_steps_an_optimizer():
    model = torch.nn.Linear(3, 2)
    ns = {"model": model, "x": torch.ones(1, 3, device="meta"),
          "opt": torch.optim.SGD(model.parameters(), lr=0.1)}
    exc = _raise(lambda: ns["model"](ns["x"]))
    cell = "model(x).sum().backward()\nopt.step()"
    diagnosis = placement_diagnosis.diagnose(exc, cell, ns, lambda filename: False)
    summaries = {c.name: c.summary for c in diagnosis.culprits}
    assert summaries == {"model": "Linear (module)", "x": "tensor float32 (1, 3); meta: no data",
                         "opt": "SGD (optimizer)"}
    assert diagnosis.fixes == ["model.to(x.device)"]  # the batch is on the accelerator: move the model


def test_diagnosis_shows_its_text_in_ipythons_plain_text_formatter():
    """Terminals, VS Code's text view and static exports show only text/plain: a dataclass's
    generated __repr__ must not win over the report's _repr_pretty_."""
    from IPython.core.formatters import PlainTextFormatter

    ns = {"x": torch.ones(3), "y": torch.ones(3, device="meta")}
    diagnosis = placement_diagnosis.diagnose(_raise(lambda: ns["x"] + ns["y"]), "x + y", ns,
                                             lambda filename: False)
    assert PlainTextFormatter()(diagnosis) == diagnosis.to_text()
