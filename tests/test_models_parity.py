"""Our decoder against Hugging Face transformers on the same weights (float32, max abs diff <= 1e-4)."""

import dataclasses

import pytest
import torch

from tiny_models import KINDS, make_hf_model
from verispec.models.weights.hf import load_hf_folder
from verispec.models.decoder.transformer import Transformer

TOL = 1e-4


def load_both(kind, folder):
    hf = make_hf_model(kind, folder, seed=3, layers=4)
    loaded = load_hf_folder(folder)
    return hf, loaded, Transformer(loaded.config, loaded.weights)


@pytest.mark.parametrize("kind", [*KINDS, "llama3"])
def test_full_and_incremental_forward_match_hf(kind, tmp_path):
    hf, loaded, ours = load_both(kind, tmp_path)
    n = 120  # long enough for the prompt-processing path (>= 48 rows) and Gemma's window of 8
    ids = torch.randint(3, 96, (n,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(ids[None]).logits[0]  # [n, vocab]
    assert ref.abs().max() > 1.0  # a model with real signal, not all-zero logits
    # the whole prompt at once
    full = ours.forward(ids, ours.new_cache(n + 8), num_logits=n).logits
    assert (full - ref).abs().max() <= TOL
    # a long chunk after a prefix (masked prompt processing), then chunks of 1 and 3 tokens
    # (decode and verification shapes), with rollbacks
    cache = ours.new_cache(n + 8)
    ours.forward(ids[:10], cache, num_logits=1)
    got = [ours.forward(ids[10:70], cache, num_logits=60).logits]
    pos = 70
    while pos < n:
        step = 1 if pos % 2 else 3
        chunk = ids[pos : pos + step]
        got.append(ours.forward(chunk, cache, num_logits=len(chunk)).logits)
        # write garbage past the end and roll it back: must not change anything
        ours.forward(torch.tensor([5, 6]), cache, num_logits=1)
        cache.truncate(pos + len(chunk))
        pos += len(chunk)
    assert (torch.cat(got) - ref[10:]).abs().max() <= TOL


def test_gemma3_sliding_window_is_applied(tmp_path):
    hf, loaded, ours = load_both("gemma3", tmp_path)
    assert loaded.config.sliding_window == 8 and "sliding_attention" in loaded.config.layer_types
    ids = torch.randint(3, 96, (30,), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = hf(ids[None]).logits[0]
    wide = Transformer(dataclasses.replace(loaded.config, sliding_window=64), loaded.weights)
    wrong = wide.forward(ids, wide.new_cache(64), num_logits=30).logits
    assert (wrong - ref).abs().max() > 1e-2  # the window matters past 8 tokens...
    assert (wrong[:8] - ref[:8]).abs().max() <= TOL  # ...and not before


def test_config_translation(tmp_path):
    make_hf_model("qwen3", tmp_path)
    cfg = load_hf_folder(tmp_path).config
    assert cfg.qk_norm and not cfg.qkv_bias and cfg.head_dim == 32 and cfg.num_kv_heads == 2
    path = tmp_path / "q2"
    path.mkdir()
    make_hf_model("qwen2", path)
    assert load_hf_folder(path).config.qkv_bias


def test_gguf_rope_frequency_factors_divide_the_frequencies():
    from verispec.models.config import RopeConfig
    from verispec.models.decoder.transformer import rope_inv_freq

    plain = rope_inv_freq(RopeConfig(theta=500000.0), 8)
    factors = (1.0, 2.0, 4.0, 8.0)
    scaled = rope_inv_freq(RopeConfig(theta=500000.0, freq_factors=factors), 8)
    assert torch.allclose(scaled, plain / torch.tensor(factors))
