"""explain/oomerror.py: every out-of-memory wording PyTorch has used recognised, with its device and size;
the look-alikes not; the figures of the current CUDA form read; a real CPU allocation failure."""
from __future__ import annotations

import pytest
import torch
from oom_wordings import WORDINGS

from torchgpu_magic.explain import oomerror as oom

GiB = 1024 ** 3
MiB = 1024 ** 2


@pytest.mark.parametrize("message, expected, source", WORDINGS,
                         ids=[f"w{i:02d}" for i in range(len(WORDINGS))])
def test_every_wording_in_the_table(message, expected, source):
    """Each wording (tests/oom_wordings.py, with where it came from) gives its device and the bytes asked;
    each look-alike gives None."""
    facts = oom.oom_facts(RuntimeError(message))
    if expected is None:
        assert facts is None, source
        return
    assert facts is not None, source
    device, asked = expected
    assert facts.device == device, source
    if asked is None:
        assert facts.asked is None, source
    else:
        assert facts.asked is not None and abs(facts.asked - asked) <= 1, source


def test_the_table_has_both_kinds_and_every_backend():
    positives = [row for row in WORDINGS if row[1] is not None]
    assert len(positives) >= 30 and len(WORDINGS) - len(positives) >= 10
    devices = {row[1][0].split(":")[0] for row in positives}
    assert devices == {"cuda", "cpu", "mps", "xpu"}
    assert any(row[0].startswith("HIP") for row in positives)


def test_the_current_cuda_form_is_read_whole():
    message = WORDINGS[0][0]
    facts = oom.oom_facts(torch.OutOfMemoryError(message))
    assert facts.backend == "cuda" and facts.wording == "allocator"
    assert facts.total == 8 * GiB and facts.free == 0 and facts.limit == 7 * GiB
    assert facts.others == ((4242, int(1.5 * GiB)),)
    assert abs(facts.in_use - 6.48 * GiB) <= 1
    assert facts.private_pools == 64 * MiB and facts.cached == 320 * MiB
    assert facts.reserved == facts.allocated + facts.cached  # allocated counts the private pools
    assert facts.to_dict()["others"] == [[4242, int(1.5 * GiB)]]


def test_the_legacy_form_gives_the_cache():
    facts = oom.oom_facts(RuntimeError(
        "CUDA out of memory. Tried to allocate 2.26 GiB (GPU 0; 6.00 GiB total capacity; 781.59 MiB already "
        "allocated; 3.03 GiB free; 1.24 GiB reserved in total by PyTorch)"))
    assert facts.wording == "allocator-legacy"
    assert facts.cached == facts.reserved - facts.allocated > 0


def test_a_real_cpu_allocation_failure():
    with pytest.raises(RuntimeError) as caught:
        torch.empty(2 ** 50, dtype=torch.uint8)
    facts = oom.oom_facts(caught.value)
    assert facts is not None and facts.device == "cpu" and facts.asked == 2 ** 50
    assert oom.is_oom(caught.value)


def test_torch_out_of_memory_error_whatever_it_says_and_python_memory_error():
    assert oom.oom_facts(torch.OutOfMemoryError("a library's own words")).device == "cuda"
    facts = oom.oom_facts(MemoryError("Unable to allocate 7.45 GiB for an array with shape (1000000000,) and "
                                      "data type float64"))
    assert facts.device == "cpu" and facts.asked == int(round(7.45 * GiB))
    assert oom.oom_facts(MemoryError()).asked is None


@pytest.mark.parametrize("exc", [
    ValueError("CUDA out of memory. Tried to allocate 2.00 GiB"),  # not an error torch raises
    TypeError("out of memory"),
    KeyError("CUDA out of memory"),
])
def test_other_exception_types_are_not_taken(exc):
    assert oom.oom_facts(exc) is None


def test_sizes_are_read_in_powers_of_1024():
    assert oom.parse_size("0 bytes") == 0
    assert oom.parse_size("12.50 MiB") == int(12.5 * MiB)
    assert oom.parse_size("1.2 GB") == int(round(1.2 * GiB))
    assert oom.parse_size("9007199254740993 bytes") == 2 ** 53 + 1  # past a float's exact integers
    assert oom.parse_size("256 bytes") == 256
