"""The accounting behind %%cudamem: the model of PyTorch's CUDA caching allocator (rounding, segments,
best fit, split and merge) on sequences worked out by hand from its rules, and the ledger's categories,
peak and phases. Standard library only: no torch, no GPU (a `gpu` test replays a sequence on a real one)."""
from __future__ import annotations

import pytest

from torchgpu_magic.cudamem.allocator import (
    CATEGORIES,
    LARGE_BUFFER,
    MIB,
    SMALL_BUFFER,
    CachingAllocatorModel,
    Ledger,
    category_of,
    round_size,
    segment_size,
)

KIB = 1024


@pytest.mark.parametrize("request_bytes, rounded", [(0, 512), (1, 512), (512, 512), (513, 1024),
                                                    (4 * 1000, 4096), (1 * MIB + 1, 1 * MIB + 512)])
def test_requests_round_up_to_512_byte_blocks(request_bytes, rounded):
    assert round_size(request_bytes) == rounded


@pytest.mark.parametrize("rounded, segment", [(512, 2 * MIB), (1 * MIB, 2 * MIB), (1 * MIB + 512, 20 * MIB),
                                              (10 * MIB - 512, 20 * MIB), (10 * MIB, 10 * MIB),
                                              (11 * MIB, 12 * MIB), (100 * MIB + 512, 102 * MIB)])
def test_segments_follow_the_small_large_and_rounded_rules(rounded, segment):
    assert segment_size(rounded) == segment


def test_small_requests_share_a_2_mib_segment_until_it_is_full():
    model = CachingAllocatorModel()
    for key in range(3):
        assert model.malloc(key, 600 * KIB) == 600 * KIB
    assert model.reserved == SMALL_BUFFER  # 3 x 600 KiB = 1800 KiB fit in 2048 KiB
    model.malloc(3, 600 * KIB)  # 248 KiB left: a second segment
    assert model.reserved == 2 * SMALL_BUFFER
    assert model.allocated == 4 * 600 * KIB


def test_a_large_request_takes_a_20_mib_segment_and_the_rest_serves_the_next():
    model = CachingAllocatorModel()
    model.malloc("a", 5 * MIB)
    assert model.reserved == LARGE_BUFFER
    model.malloc("b", 12 * MIB)  # the 15 MiB remainder of the first segment (best fit)
    assert model.reserved == LARGE_BUFFER
    model.malloc("c", 12 * MIB)  # 3 MiB left there: a segment of its own, 12 MiB
    assert model.reserved == LARGE_BUFFER + 12 * MIB
    assert model.peak_allocated == 29 * MIB


def test_a_large_remainder_of_one_mib_or_less_is_not_split_and_counts_as_allocated():
    model = CachingAllocatorModel()
    model.malloc("a", 11 * MIB)  # segment 12 MiB, 1 MiB left: kept whole (a split needs > 1 MiB)
    assert model.reserved == 12 * MIB
    assert model.allocated == 12 * MIB  # what torch.cuda.memory_allocated counts: the whole block


def test_freed_blocks_merge_with_free_neighbours_and_are_reused_without_new_segments():
    model = CachingAllocatorModel()
    for key in "abcd":
        model.malloc(key, 5 * MIB)  # four 5 MiB blocks from one 20 MiB segment
    assert model.reserved == LARGE_BUFFER
    model.free("b")
    model.free("c")  # b and c merge into one 10 MiB free block
    model.malloc("e", 8 * MIB)  # fits the merged block, split (2 MiB left > 1 MiB): no new segment
    assert model.reserved == LARGE_BUFFER
    assert model.allocated == 5 * MIB * 2 + 8 * MIB
    model.free("e")
    model.malloc("f", 9 * MIB)  # the 10 MiB block again; 1 MiB left is not worth a split: counted whole
    assert model.allocated == 5 * MIB * 2 + 10 * MIB
    model.free("nothing")  # an unknown key is ignored
    assert model.allocated == 20 * MIB


def test_the_reserved_peak_keeps_its_high_water_mark_after_frees():
    model = CachingAllocatorModel()
    model.malloc("a", 30 * MIB)
    model.free("a")
    model.malloc("b", 40 * MIB)  # the cached 30 MiB block is too small: 40 MiB more
    assert (model.reserved, model.peak_reserved, model.peak_allocated) == (70 * MIB, 70 * MIB, 40 * MIB)


def test_the_ledger_keeps_categories_peak_phase_module_and_phase_peaks():
    ledger = Ledger()
    ledger.add("w", 100, "parameters")
    phase = ["forward", "model.0"]
    ledger.start(lambda: tuple(phase))
    assert ledger.baseline == 100
    ledger.add("act", 400, "activations")
    phase[:] = ["backward", "model.1"]
    ledger.remove("act")
    ledger.add("tmp", 300, "temporaries")
    ledger.recategorize("tmp", "gradients")
    ledger.resize("tmp", 350)
    ledger.stop()
    ledger.add("late", 10**9, "other")  # after the run: ignored
    assert ledger.peak == 500
    assert (ledger.peak_phase, ledger.peak_module) == ("forward", "model.0")
    assert ledger.peak_categories["activations"] == 400
    assert ledger.phase_peaks == {"before the cell": 100, "forward": 500, "backward": 450}
    assert ledger.end == 450 and ledger.end_categories["gradients"] == 350
    assert set(ledger.by_category) == set(CATEGORIES)


def test_a_cuda_ledger_counts_the_blocks_the_allocator_hands_out():
    ledger = Ledger(CachingAllocatorModel())
    ledger.start(lambda: ("forward", None))
    ledger.add("x", 4, "activations")
    ledger.add("y", 1000, "activations")
    assert ledger.peak == 512 + 1024
    assert ledger.reserved_peak == SMALL_BUFFER


def test_memtracker_reference_types_map_to_the_report_categories():
    assert [category_of(t) for t in ("Parameter", "Buffer", "Gradient", "Activation", "Temp", "Optstate",
                                     "Other", "Unknown")] == [
        "parameters", "buffers", "gradients", "activations", "temporaries", "optimizer state", "other",
        "other"]


@pytest.mark.gpu
def test_the_model_reserves_what_the_real_allocator_reserves_for_the_same_sequence():
    """In a fresh process, so that no segment cached before serves the sequence."""
    from fresh_process import run_fresh

    done = run_fresh(
        "from torchgpu_magic.cudamem.allocator import CachingAllocatorModel\n"
        "KIB, MIB = 1024, 2**20\n"
        "model, live = CachingAllocatorModel(), {}\n"
        "sizes = [600 * KIB, 5 * MIB, 12 * MIB, 700 * KIB, 11 * MIB, 3 * MIB, 64 * MIB, 100]\n"
        "for i, size in enumerate(sizes):\n"
        "    live[i] = torch.empty(size, dtype=torch.uint8, device='cuda')\n"
        "    model.malloc(i, size)\n"
        "    if i == 3:\n"
        "        del live[1]\n"
        "        model.free(1)\n"
        "print(torch.cuda.memory_reserved(), model.reserved, torch.cuda.memory_allocated(),\n"
        "      model.allocated)\n")
    assert done.returncode == 0, done.stderr
    reserved, modelled, allocated, allocated_model = map(int, done.stdout.split()[-4:])
    assert (reserved, allocated) == (modelled, allocated_model)
