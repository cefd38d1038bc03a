"""GGUF blocks kept as loaded (models/quant.py, kernels/quant.h): the unpacking gives gguf-py's
float32 values bit for bit on every kernel variant, products over blocks are the float32
products over the dequantised matrix, and a model loaded as blocks computes exactly what its
float32 conversion computes (tiny synthetic GGUF files written by models/synth.py, and SmolLM2)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from verispec.errors import UnsupportedModelError
from verispec.models.kernels import rowwise
from verispec.models.kernels.quant import FORMATS, QuantTensor
from verispec.models.weights.synth import SIZES, random_blocks, write

FORMAT_NAMES = [name for t, (name, _, _) in FORMATS.items() if t != 0]


def _blocks(fmt: str, rows: int, cols: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if fmt in ("F16", "BF16"):
        x = rng.normal(0, 1, rows * cols).astype(np.float32)
        if fmt == "F16":
            # a few subnormals, zeros, infinities beside the normals
            x[:4] = [6e-8, -3e-6, 0.0, np.inf]
            return x.astype(np.float16).view(np.uint8).reshape(rows, cols * 2)
        return (x.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8).reshape(rows, cols * 2)
    return random_blocks(rng, fmt, rows, cols, scale=0.05)


def _reference(raw: np.ndarray, fmt: str, cols: int) -> torch.Tensor:
    import gguf

    t = gguf.GGMLQuantizationType[fmt]
    return torch.from_numpy(np.ascontiguousarray(gguf.quants.dequantize(raw, t), dtype=np.float32).reshape(raw.shape[0], cols))


def _variants():
    return [rowwise.load_variant(v) for v in rowwise.supported_variants()]


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_unpacking_is_gguf_py_bit_for_bit_on_every_variant(fmt):
    rows, cols = 24, 512
    raw = _blocks(fmt, rows, cols, seed=len(fmt))
    ref = _reference(raw, fmt, cols)
    q = QuantTensor([torch.from_numpy(raw)], [FORMATS_BY_NAME[fmt]], cols)
    ids = torch.tensor([5, 0, 23, 5])
    for k in _variants():
        got = k.dequantize(q.arg, cols)
        assert torch.equal(got.view(torch.int32), ref.view(torch.int32)), f"{fmt} on {k.variant()}"
        assert torch.equal(k.take_rows(q.arg, cols, ids).view(torch.int32), ref[ids].view(torch.int32))


FORMATS_BY_NAME = {name: t for t, (name, _, _) in FORMATS.items()}


@pytest.mark.parametrize("fmt", ["F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q8_0", "Q4_K", "Q5_K", "Q6_K"])
def test_products_over_blocks_are_the_float32_products_row_for_row(fmt):
    rows, cols = 37, 768  # 37 outputs: whole blocks of outputs and a remainder
    raw = _blocks(fmt, rows, cols, seed=3)
    q = QuantTensor([torch.from_numpy(raw)], [FORMATS_BY_NAME[fmt]], cols)
    ref = _reference(raw, fmt, cols)
    x = torch.randn(11, cols, generator=torch.Generator().manual_seed(1))
    for k in _variants():
        alone = torch.cat([k.weight_mm(x[r : r + 1], q.arg) for r in range(11)])
        for n in (1, 2, 3, 5, 8, 11):
            y = k.weight_mm(x[:n], q.arg)
            assert torch.equal(y, k.rows_mm(x[:n], ref)), f"{fmt} {n} rows on {k.variant()}"
            assert torch.equal(y, alone[:n]), f"{fmt}: a row's result moved with its neighbours on {k.variant()}"


def test_stacked_parts_of_different_formats():
    cols = 512
    a, b = _blocks("Q4_K", 16, cols, 1), _blocks("Q6_K", 8, cols, 2)
    f = torch.randn(5, cols)
    q = QuantTensor([torch.from_numpy(a), torch.from_numpy(b), f], [12, 14, 0], cols)
    assert q.shape == (29, cols) and q.formats == ["Q4_K", "Q6_K", "F32"]
    full = torch.cat([_reference(a, "Q4_K", cols), _reference(b, "Q6_K", cols), f])
    assert torch.equal(q.dequantize(), full)
    x = torch.randn(4, cols)
    k = rowwise.kernel()
    assert torch.equal(k.weight_mm(x, q.arg), k.rows_mm(x, full))
    assert torch.equal(q.take(torch.tensor([0, 17, 28])), full[[0, 17, 28]])


def test_the_comparison_sees_a_last_bit_change():
    """Negative control: the same products summed in another order (MKL's x @ W^T over the same
    float32 weights) differ in the last bits from the kernel's, so the bit-for-bit comparisons
    above would catch a kernel that accumulated in any other order than ops.h's dot."""
    cols = 768
    raw = _blocks("Q4_K", 64, cols, 9)
    ref = _reference(raw, "Q4_K", cols)
    q = QuantTensor([torch.from_numpy(raw)], [12], cols)
    x = torch.randn(4, cols, generator=torch.Generator().manual_seed(2))
    ours, other = rowwise.kernel().weight_mm(x, q.arg), x @ ref.T
    assert not torch.equal(ours, other)
    assert torch.allclose(ours, other, atol=1e-5)  # only last bits apart


def test_bad_parts_are_refused_clearly():
    with pytest.raises(UnsupportedModelError, match="type 99 is not supported"):
        QuantTensor([torch.zeros(2, 18, dtype=torch.uint8)], [99], 32)
    with pytest.raises(ValueError, match="Q4_0 part must be contiguous torch.uint8 \\[rows, 18\\]"):
        QuantTensor([torch.zeros(2, 20, dtype=torch.uint8)], [2], 32)
    with pytest.raises(UnsupportedModelError, match="whole 256-weight blocks"):
        QuantTensor([torch.zeros(2, 144, dtype=torch.uint8)], [12], 100)
    k = rowwise.kernel()
    with pytest.raises(RuntimeError, match="not supported"):
        k.weight_mm(torch.zeros(1, 32), ([torch.zeros(2, 18, dtype=torch.uint8)], [99]))


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    folder = tmp_path_factory.mktemp("synth")
    return {mix: write(folder / f"tiny-{mix}.gguf", SIZES["tiny"], mix, seed=i, progress=False)
            for i, mix in enumerate(["q4_k_m", "q4_1", "q5_0", "q8_0"])}


@pytest.mark.parametrize("mix", ["q4_k_m", "q4_1", "q5_0", "q8_0"])
def test_a_model_as_blocks_computes_what_its_float32_conversion_computes(synthetic, mix):
    from verispec.runners.registry import RunnerConfig, build_runner

    path = str(synthetic[mix])
    blocks = build_runner("torch", RunnerConfig(path))  # the default: the file's blocks
    floats = build_runner("torch", RunnerConfig(path, weights_format="float32"))
    assert blocks.weights_format == "gguf" and blocks.model.quantised
    assert floats.weights_format == "float32" and not floats.model.quantised
    assert blocks.weight_bytes < floats.weight_bytes / 3
    # 67 tokens: the blocks' prompt goes through the decoding rows' products (the kernel's Stack), the
    # float32 model's through F.linear: so the blocks' prompt is the float32 model's decoding of it
    # token by token, bit for bit (the same keys and values after it)
    prompt = list(range(3, 70))
    sa, sb = blocks.open(128), floats.open(128)
    la = blocks.forward(sa, prompt).logits
    for t in prompt:
        lb = floats.forward(sb, [t]).logits
    assert torch.equal(la, lb)
    for step in range(4):  # decoding rows, then a 5-row verification
        tok = [int(la[-1].argmax())]
        la, lb = blocks.forward(sa, tok).logits, floats.forward(sb, tok).logits
        assert torch.equal(la, lb), f"step {step}"
    draft = [7, 8, 9, 10, 11]
    assert torch.equal(blocks.forward(sa, draft, num_logits=5).logits, floats.forward(sb, draft, num_logits=5).logits)


def test_speculative_output_on_blocks_is_plain_decoding(synthetic):
    from verispec import LLM, SamplingParams

    path = str(synthetic["q4_k_m"])
    prompts = [list(range(3, 40)) * 2, [5, 6, 7, 8] * 5]
    params = SamplingParams(max_tokens=40, temperature=0.0)
    plain = [o.outputs[0].token_ids for o in LLM(path).generate(prompts, params)]
    for spec in ({"method": "prompt_lookup", "num_speculative_tokens": 4, "adaptive_k": False},
                 {"method": "draft_model", "draft_model": path, "num_speculative_tokens": 3, "adaptive_k": False}):
        outs = LLM(path, speculative=spec).generate(prompts, params)
        assert [o.outputs[0].token_ids for o in outs] == plain, spec["method"]


def test_llamacpp_reads_our_synthetic_file_as_we_do(synthetic):
    """The writer and the unpacking agree with llama.cpp on what the blocks mean: its logits for
    the same file are close to ours (it rounds activations to 8 bits, so not equal)."""
    from verispec.runners.registry import RunnerConfig, build_runner

    path = str(synthetic["q4_k_m"])
    ours, theirs = build_runner("torch", RunnerConfig(path)), build_runner("llamacpp", RunnerConfig(path))
    prompt = list(range(3, 30))
    a = ours.forward(ours.open(64), prompt).logits[-1]
    b = theirs.forward(theirs.open(64), prompt).logits[-1]
    assert torch.corrcoef(torch.stack([a, b]))[0, 1] > 0.99


def test_bundled_model_as_blocks_is_bit_identical_to_float32():
    from verispec.runners.registry import RunnerConfig, build_runner

    blocks = build_runner("torch", RunnerConfig("smollm2-135m", weights_format="gguf"))
    floats = build_runner("torch", RunnerConfig("smollm2-135m", weights_format="float32"))
    assert blocks.model.quantised == ["Q4_1", "Q8_0"]
    prompt = blocks.tokenizer.encode("The printing press changed how ideas spread because")
    sa, sb = blocks.open(128), floats.open(128)
    la, lb = blocks.forward(sa, prompt).logits, floats.forward(sb, prompt).logits
    assert torch.equal(la, lb)
    for _ in range(3):
        tok = [int(la[-1].argmax())]
        la, lb = blocks.forward(sa, tok).logits, floats.forward(sb, tok).logits
        assert torch.equal(la, lb)
    assert torch.equal(blocks.forward(sa, prompt[:6], num_logits=6).logits, floats.forward(sb, prompt[:6], num_logits=6).logits)


def test_weights_format_gguf_needs_a_gguf_file(tiny_dir):
    from verispec.runners.registry import RunnerConfig, build_runner
    from verispec.errors import ConfigError

    with pytest.raises(ConfigError, match="needs a .gguf model"):
        build_runner("torch", RunnerConfig(str(tiny_dir("llama")), weights_format="gguf"))


def test_later_loads_read_the_cached_metadata_not_the_file(tmp_path, monkeypatch):
    """The first load reads the GGUF's metadata (GGUFFile); later loads (either backend's) use
    the cached config, tokenizer and tensor table, and a rewritten file is read afresh."""
    from verispec.models.weights import loaders
    from verispec.models.weights.loaders import load_gguf_blocks, load_gguf_meta

    monkeypatch.setattr(loaders, "cache_root", lambda: tmp_path / "cache")  # the metadata cache only
    path = write(tmp_path / "m.gguf", SIZES["tiny"], "q4_1", seed=5, progress=False)
    first = load_gguf_blocks(path)

    def refuse(*args, **kwargs):
        raise AssertionError("the metadata reader was called on a cached file")

    monkeypatch.setattr(loaders, "GGUFFile", refuse)
    again = load_gguf_blocks(path)
    assert again.config == first.config and again.tokenizer.encode("w1 w2") == first.tokenizer.encode("w1 w2")
    assert torch.equal(again.weights["layers.1.qkv.weight"].dequantize(), first.weights["layers.1.qkv.weight"].dequantize())
    assert load_gguf_meta(path)[0] == first.config
    write(path, SIZES["tiny"], "q8_0", seed=6, progress=False)  # the same path, new contents
    with pytest.raises(AssertionError, match="reader was called"):
        load_gguf_blocks(path)


def test_a_format_the_kernels_lack_falls_back_to_float32(tmp_path, caplog):
    """A GGUF with a tensor the row-wise kernels do not unpack (Q2_K here): the default loads it
    dequantised to float32 (with a warning) and runs; asking for its blocks is refused clearly."""
    import gguf

    from verispec.runners.registry import RunnerConfig, build_runner
    from verispec.errors import UnsupportedWeightFormatError

    path = write(tmp_path / "m.gguf", SIZES["tiny"], "q8_0", seed=7, progress=False)
    reader = gguf.GGUFReader(str(path))
    w = gguf.GGUFWriter(str(tmp_path / "q2k.gguf"), "llama")
    for field in reader.fields.values():  # the same metadata
        if field.name.startswith(("GGUF.", "general.architecture")):
            continue
        w.add_key_value(field.name, field.contents(), field.types[0], field.types[-1] if len(field.types) > 1 else None)
    rng = np.random.default_rng(0)
    for t in reader.tensors:
        if t.name == "blk.0.ffn_up.weight":  # Q2_K: 84 bytes per 256 weights, random, with small scales
            rows, cols = int(t.shape[1]), int(t.shape[0])
            raw = rng.integers(0, 256, size=(rows, cols // 256, 84), dtype=np.uint8)
            raw[:, :, 80:84] = np.frombuffer(np.full(rows * cols // 256 * 2, 0.001, np.float16).tobytes(), np.uint8).reshape(rows, cols // 256, 4)
            w.add_tensor(t.name, raw.reshape(rows, -1), raw_shape=(rows, cols // 256 * 84), raw_dtype=gguf.GGMLQuantizationType.Q2_K)
        else:
            w.add_tensor(t.name, np.array(t.data), raw_shape=tuple(t.data.shape), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    q2k = str(tmp_path / "q2k.gguf")
    with caplog.at_level("WARNING", logger="verispec"):
        runner = build_runner("torch", RunnerConfig(q2k))
    assert runner.weights_format == "float32" and "Q2_K" in caplog.text
    logits = runner.forward(runner.open(32), [1, 5, 9]).logits
    assert torch.isfinite(logits).all()
    with pytest.raises(UnsupportedWeightFormatError, match="do not unpack"):
        build_runner("torch", RunnerConfig(q2k, weights_format="gguf"))
