"""The accounting of a tracked run: what is alive, by category, and its peak; and, for a CUDA target, the
CUDA caching allocator's view of the same allocations.

``%%cudamem`` sees every tensor storage a cell allocates and frees (torch's ``MemTracker``, in
:mod:`.run`) and hands each event to a :class:`Ledger`. The ledger keeps the live bytes per category
(parameters, buffers, gradients, activations, temporaries, optimizer state, other), the peak with the
categories, phase and module at that moment, and each phase's own peak. For a CUDA target the bytes are
those the caching allocator would hand out: each request goes through :class:`CachingAllocatorModel`,
which replays PyTorch's rules (its constants below) and so also gives the memory the allocator would
reserve from the driver.

Standard library only: the events carry sizes and names, never tensors.
"""
from __future__ import annotations

import bisect
from typing import Any, Callable, Optional

from .series import StepSeries

KIB = 1024
MIB = 1024 * KIB
GIB = 1024 * MIB

# The CUDA caching allocator's constants (c10/cuda/CUDACachingAllocator.cpp and, since torch 2.6,
# c10/core/AllocatorConfig.h; unchanged since torch 1.x): all sizes are rounded up to kMinBlockSize;
# requests of at most kSmallSize go to the small pool, packed in kSmallBuffer segments; larger requests
# below kMinLargeAlloc get a kLargeBuffer segment; the rest a segment of their size rounded up to
# kRoundLarge.
MIN_BLOCK = 512
SMALL_SIZE = 1 * MIB
SMALL_BUFFER = 2 * MIB
LARGE_BUFFER = 20 * MIB
MIN_LARGE_ALLOC = 10 * MIB
ROUND_LARGE = 2 * MIB
ALLOCATOR_SOURCE = ("PyTorch's CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp: kMinBlockSize "
                    "512 B, kSmallSize 1 MiB, kSmallBuffer 2 MiB, kLargeBuffer 20 MiB, kMinLargeAlloc "
                    "10 MiB, kRoundLarge 2 MiB)")

CATEGORIES = ("parameters", "buffers", "gradients", "activations", "temporaries", "optimizer state",
              "other", "workspaces")
"""The categories a report shows, in this order. The first seven are MemTracker's reference types
(``Parameter``, ``Buffer``, ``Gradient``, ``Activation``, ``Temp``, ``Optstate``, ``Other``: tensors
the cell uses that are none of the rest, such as its input batch); ``workspaces`` holds the cuBLAS
workspaces a CUDA target allocates through the caching allocator at its first matrix product."""

_CATEGORY_OF = {"Parameter": "parameters", "Buffer": "buffers", "Gradient": "gradients",
                "Activation": "activations", "Temp": "temporaries", "Optstate": "optimizer state",
                "Other": "other"}

PHASES = ("before the cell", "forward", "outside modules", "backward", "optimizer step")
"""When an allocation happens: what the cell held before it ran (the models, optimizers and tensors it
uses), a module's forward, code outside any module (the loss, building a batch), the backward pass, an
optimizer's ``step``."""


def category_of(reftype: str) -> str:
    """Our name for a MemTracker reference type (``'Optstate'`` -> ``'optimizer state'``)."""
    return _CATEGORY_OF.get(reftype, "other")


def round_size(nbytes: int) -> int:
    """The size the caching allocator hands out for a request: a multiple of 512 B, at least 512 B."""
    return max(MIN_BLOCK, MIN_BLOCK * ((nbytes + MIN_BLOCK - 1) // MIN_BLOCK))


def segment_size(rounded: int) -> int:
    """The segment the allocator asks the driver for when no cached block fits a request of this size."""
    if rounded <= SMALL_SIZE:
        return SMALL_BUFFER
    if rounded < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return ROUND_LARGE * ((rounded + ROUND_LARGE - 1) // ROUND_LARGE)


class _Block:
    """A piece of one segment, free or handed out; neighbours are linked as in the allocator."""

    __slots__ = ("size", "offset", "segment", "small", "free", "prev", "next")

    def __init__(self, size: int, offset: int, segment: int, small: bool) -> None:
        self.size, self.offset, self.segment, self.small = size, offset, segment, small
        self.free = True
        self.prev: Optional[_Block] = None
        self.next: Optional[_Block] = None

    def key(self) -> tuple:
        return (self.size, self.segment, self.offset)


class CachingAllocatorModel:
    """Replays allocations and frees through the CUDA caching allocator's rules, on one stream and with
    memory to spare: best fit among the cached free blocks of the request's pool, a new segment when none
    fits, split when the remainder is worth keeping (>= 512 B in the small pool, > 1 MiB in the large),
    merge with free neighbours on free, and nothing given back to the driver (no ``empty_cache``).

    ``allocated`` is the sum of the blocks handed out (what ``torch.cuda.memory_allocated`` counts: a
    block the allocator did not split counts whole), ``reserved`` the sum of the segments
    (``memory_reserved``); both keep their peaks. Near the device's capacity the real allocator frees
    cached segments and retries before it raises out-of-memory, so its reserved memory can then stay
    below this model's.
    """

    def __init__(self) -> None:
        self._free: dict = {True: [], False: []}  # small pool? -> sorted [(size, segment, offset, block)]
        self._live: dict = {}
        self._segments = 0
        self.allocated = self.reserved = self.peak_allocated = self.peak_reserved = 0

    def _put(self, block: _Block) -> None:
        block.free = True
        bisect.insort(self._free[block.small], (*block.key(), block))

    def malloc(self, key: Any, nbytes: int) -> int:
        """Hand out a block for a request of ``nbytes`` under ``key``; returns the block's size."""
        size = round_size(nbytes)
        small = size <= SMALL_SIZE
        pool = self._free[small]
        index = bisect.bisect_left(pool, (size,))
        if index < len(pool):
            block = pool.pop(index)[3]
        else:
            self._segments += 1
            block = _Block(segment_size(size), 0, self._segments, small)
            self.reserved += block.size
            self.peak_reserved = max(self.peak_reserved, self.reserved)
        remaining = block.size - size
        if (remaining >= MIN_BLOCK) if small else (remaining > SMALL_SIZE):
            rest = _Block(remaining, block.offset + size, block.segment, small)
            rest.prev, rest.next = block, block.next
            if block.next is not None:
                block.next.prev = rest
            block.next = rest
            block.size = size
            self._put(rest)
        block.free = False
        self._live[key] = block
        self.allocated += block.size
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        return block.size

    def free(self, key: Any) -> None:
        """Give back the block handed out under ``key`` (unknown keys are ignored) and merge it with
        free neighbours of its segment."""
        block = self._live.pop(key, None)
        if block is None:
            return
        self.allocated -= block.size
        for neighbour in (block.prev, block.next):
            if neighbour is None or not neighbour.free:
                continue
            pool = self._free[neighbour.small]
            del pool[bisect.bisect_left(pool, neighbour.key())]
            first, second = (neighbour, block) if neighbour is block.prev else (block, neighbour)
            first.size += second.size
            first.next = second.next
            if second.next is not None:
                second.next.prev = first
            block = first
        self._put(block)


class Ledger:
    """The live bytes of a tracked run by category, its peak and when the peak happened.

    Events come from the tracker: :meth:`add`, :meth:`remove`, :meth:`resize` and :meth:`recategorize`,
    keyed by the tracker's record of one storage. ``where`` is asked, at each allocation, for
    ``(phase, module)``: the phase (see :data:`PHASES`) and the innermost module running. With an
    ``allocator`` (a CUDA target) every size is the block the caching allocator would hand out; without,
    the bytes of the storage. :meth:`start` marks the cell's start (what is live then is the baseline);
    :meth:`stop` freezes the ledger, so frees that arrive after the run change nothing.

    From :meth:`start` on, every event is also a row of :attr:`series` (a :class:`~.series.StepSeries`),
    with the phase, module, operator and cell line then (``context``, given to :meth:`start`, answers
    ``(op, line)``); the series' ``peak_row`` is the row of the peak.
    """

    def __init__(self, allocator: Optional[CachingAllocatorModel] = None) -> None:
        self.allocator = allocator
        self.live: dict = {}  # key -> (bytes, category)
        self.by_category = dict.fromkeys(CATEGORIES, 0)
        self.total = 0
        self.peak = 0
        self.peak_categories = dict(self.by_category)
        self.peak_phase = PHASES[0]
        self.peak_module: Optional[str] = None
        self.phase_peaks: dict = {}
        self.baseline = 0
        self.end = 0
        self.end_categories = dict(self.by_category)
        self.where: Callable[[], tuple] = lambda: (PHASES[0], None)
        self.context: Callable[[], tuple] = lambda: (None, None)
        self.series = StepSeries(CATEGORIES, PHASES)
        self._recording = False
        self._running = True

    def start(self, where: Callable[[], tuple], context: Optional[Callable[[], tuple]] = None) -> None:
        """The cell starts: what is live now is its baseline and the series' row 0; ``where`` tells phase
        and module from now, ``context`` operator and cell line."""
        self.baseline = self.total
        self.phase_peaks[PHASES[0]] = self.total
        self.where = where
        if context is not None:
            self.context = context
        self.series.start(self.by_category)
        self._recording = True

    def stop(self) -> None:
        """The cell has ended: keep the figures as they are now."""
        self.end = self.total
        self.end_categories = dict(self.by_category)
        self._running = self._recording = False

    def add(self, key: Any, nbytes: int, category: str) -> None:
        """A storage of ``nbytes`` became live, in ``category``."""
        if not self._running or key in self.live:
            return
        size = self.allocator.malloc(key, nbytes) if self.allocator is not None else nbytes
        self.live[key] = (size, category)
        self.by_category[category] += size
        self.total += size
        phase, module = self.where()
        if self._recording:
            self.series.record("alloc", category, size, phase, module, *self.context())
        if self.total > self.phase_peaks.get(phase, -1):
            self.phase_peaks[phase] = self.total
        if self.total > self.peak:
            self.peak = self.total
            self.peak_categories = dict(self.by_category)
            self.peak_phase, self.peak_module = phase, module
            self.series.peak_row = self.series.events if self._recording else 0

    def remove(self, key: Any) -> None:
        """A storage was freed."""
        if not self._running or key not in self.live:
            return
        size, category = self.live.pop(key)
        if self.allocator is not None:
            self.allocator.free(key)
        self.by_category[category] -= size
        self.total -= size
        if self._recording:
            self.series.record("free", category, size, *self.where(), *self.context())

    def resize(self, key: Any, nbytes: int) -> None:
        """A storage changed size (``resize_``): the allocator frees it and hands out a new block."""
        if not self._running or key not in self.live:
            return
        category = self.live[key][1]
        self.remove(key)
        self.add(key, nbytes, category)

    def recategorize(self, key: Any, category: str) -> None:
        """A storage turned out to be something else (a gradient first seen as a temporary)."""
        if not self._running or key not in self.live:
            return
        size, old = self.live[key]
        self.live[key] = (size, category)
        self.by_category[old] -= size
        self.by_category[category] += size
        if self._recording:
            self.series.record("recategorize", category, size, *self.where(), *self.context(), old)

    @property
    def reserved_peak(self) -> Optional[int]:
        """The caching allocator's peak reserved memory, for a CUDA target; None otherwise."""
        return self.allocator.peak_reserved if self.allocator is not None else None
