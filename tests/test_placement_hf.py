"""%whereis on Hugging Face models built from config only (no weights, no hub), as loaded and as
dispatched by accelerate with cpu and disk offload, through a real InteractiveShell.

(Hugging Face models call ``.item()`` and copy index tensors inside forward, so ``meta`` cannot stand in
for a GPU in a forward here: the mismatch diagnosis on ``model(**batch)`` is tested on a plain module in
test_whereis.py.)"""
from __future__ import annotations

import re

import pytest
from conftest import run
from IPython.utils.capture import capture_output

pytest.importorskip("transformers")
pytest.importorskip("accelerate")

BUILD = (
    "import os\nos.environ['HF_HUB_OFFLINE'] = '1'\n"
    "import torch, transformers\nfrom accelerate import dispatch_model, cpu_offload\n"
    "transformers.logging.set_verbosity_error()\n"
    "cfg = transformers.GPT2Config(n_layer=3, n_embd=32, n_head=2, vocab_size=100, n_positions=16,\n"
    "                              bos_token_id=0, eos_token_id=0)\n"
    "torch.manual_seed(0)\n"
    "ids = torch.tensor([[1, 2, 3]])\n"
)


def _text(ip, code: str) -> str:
    with capture_output() as captured:
        ip.run_cell(code)
    return "\n".join(o.data.get("text/plain", "") for o in captured.outputs) + captured.stdout


def test_tied_lm_head_shows_the_shared_weights_device(ip):
    run(ip, BUILD + "gpt = transformers.GPT2LMHeadModel(cfg)")
    text = _text(ip, "%whereis gpt")
    row = next(line for line in text.splitlines() if line.startswith("lm_head "))
    assert re.match(r"lm_head\s+Linear\s+cpu\s+float32\s+0\s", row), row
    assert "weight tied to transformer.wte.weight (counted there)" in row
    assert "Parameters on meta" not in text


def test_dispatch_with_cpu_and_disk_offload_says_where_the_weights_live(ip, tmp_path):
    device_map = {"transformer.wte": "cpu", "transformer.wpe": "cpu", "transformer.drop": "cpu",
                  "transformer.h.0": "cpu", "transformer.h.1": "disk", "transformer.h.2": "disk",
                  "transformer.ln_f": "cpu", "lm_head": "cpu"}
    run(ip, BUILD + f"gpt = dispatch_model(transformers.GPT2LMHeadModel(cfg), device_map={device_map!r}, "
                    f"offload_dir={str(tmp_path)!r})\nlogits = gpt(ids).logits")
    assert tuple(ip.user_ns["logits"].shape) == (1, 3, 100)  # the forward really runs
    text = _text(ip, "%whereis gpt")
    header = r"^gpt: GPT2LMHeadModel, [\d.]+K params, [\d.]+ KiB on cpu, [\d.]+ KiB on disk"
    assert re.search(header, text, re.M)
    assert re.search(r"^transformer\.h\.1\.\.2\s+2 × GPT2Block\s+disk\s", text, re.M)  # not merged with h.0
    assert re.search(r"^transformer\.h\.0\s+GPT2Block\s+cpu\s", text, re.M)
    assert "Offloaded by accelerate: the weights of 12 module(s) live on disk" in text
    assert "loaded onto cpu for each forward; the forward runs as is." in text
    assert "materialise them" not in text and "inputs must be on the device" not in text
    table = _text(ip, "%whereis")
    assert re.search(r"^disk: 1 object, [\d.]+ KiB", table, re.M)
    assert "offloaded by accelerate to disk" in table
    assert "meta" not in table


def test_cpu_offload_says_the_weights_are_on_cpu(ip):
    run(ip, BUILD + "gpt = transformers.GPT2LMHeadModel(cfg)\ncpu_offload(gpt, execution_device='cpu')\n"
                    "logits = gpt(ids).logits")
    text = _text(ip, "%whereis gpt")
    assert "live on cpu (meta tensors stand in for them)" in text and "materialise them" not in text
    assert "accelerate: weights on cpu, loaded onto cpu for each forward" in text
    table = _text(ip, "%whereis")
    assert "offloaded by accelerate to cpu" in table and "meta: no data" not in table


def test_bert_from_config_with_a_half_precision_encoder(ip):
    """BERT from config; a half-precision encoder layer shows as its own row, with the dtype split
    flagged where it is."""
    run(ip, BUILD + "bert = transformers.BertModel(transformers.BertConfig(num_hidden_layers=2, "
                    "hidden_size=32, num_attention_heads=2, intermediate_size=64, vocab_size=100))\n"
                    "bert.encoder.layer[1].half()")
    text = _text(ip, "%whereis bert")
    assert re.search(r"^bert: BertModel, [\d.]+K params, [\d.]+ KiB on cpu", text, re.M)
    assert re.search(r"^encoder\.layer\.1\s+BertLayer\s+cpu\s+float16\s", text, re.M), text
    assert re.search(r"^encoder\.layer\.0\s+BertLayer\s+cpu\s+float32\s", text, re.M), text
