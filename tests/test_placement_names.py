"""placement/names.py: resolving %whereis NAME without evaluating code."""
from __future__ import annotations

import pytest
import torch

from torchgpu_magic.errors import MagicInputError
from torchgpu_magic.placement import names


def test_resolve_is_static_and_suggests_close_names():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    ns = {"model": model, "batch": [torch.ones(1)], "d": {"w": torch.ones(1)}}
    assert names.resolve("model[0].weight", ns) is model[0].weight
    assert names.resolve("model[-1]", ns) is model[0]
    assert names.resolve("d['w']", ns) is ns["d"]["w"]
    with pytest.raises(MagicInputError, match="did you mean model"):
        names.resolve("modle", ns)
    with pytest.raises(MagicInputError, match="not a name"):
        names.resolve("model(1)", ns)
    with pytest.raises(MagicInputError, match="constant indices"):
        names.resolve("batch[i]", ns)

    class Lazy:
        @property
        def weights(self):  # pragma: no cover - must not run
            raise AssertionError("property ran")

    with pytest.raises(MagicInputError, match="does not run code"):
        names.resolve("lazy.weights", {"lazy": Lazy()})
