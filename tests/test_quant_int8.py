"""Products over GGUF blocks with int8 activations (weights_format "gguf-int8", kernels/quant8.h):
the arithmetic quant8.h defines, checked against a float64 reference of it; the same bits on
every kernel variant and whatever a row's neighbours; a model on it decodes speculatively
exactly as it decodes plainly; and it is really a different arithmetic from the exact one."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from verispec.models.kernels import rowwise
from verispec.models.kernels.quant import FORMATS, INT8, INT8_FORMATS, TILE_FORMATS, QuantTensor
from verispec.models.weights.synth import SIZES, random_blocks, write

BY_NAME = {name: t for t, (name, _, _) in FORMATS.items()}
INT8_NAMES = sorted(FORMATS[t][0] for t in INT8_FORMATS)


def _x_blocks(x: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """x [R, in] float32 quantised as quant8.h does, per 32-value block: (q int64 [R, in / 32, 32],
    d float32 [R, in / 32]); a = max |x|, d = float32(a / 127), q = round-half-even(float32(x * float32(127 / a)))."""
    xb = x.numpy().astype(np.float32).reshape(x.shape[0], -1, 32)
    a = np.abs(xb).max(axis=2)
    with np.errstate(divide="ignore", invalid="ignore"):
        d = np.where(a > 0, a / np.float32(127), np.float32(0)).astype(np.float32)
        inv = np.where(a > 0, np.float32(127) / a, np.float32(0)).astype(np.float32)
    q = np.clip(np.rint((xb * inv[..., None]).astype(np.float32)), -127, 127).astype(np.int64)
    return q, d


def _quantised_x(x: torch.Tensor) -> np.ndarray:
    """x [R, in] float32 -> the values quant8.h multiplies by (q * d per 32-value block), float64."""
    q, d = _x_blocks(x)
    return (q.astype(np.float64) * d[..., None].astype(np.float64)).reshape(x.shape)


def _dequantised(raw: np.ndarray, fmt: str, cols: int) -> np.ndarray:
    import gguf

    t = gguf.GGMLQuantizationType[fmt]
    return np.asarray(gguf.quants.dequantize(raw, t), dtype=np.float64).reshape(raw.shape[0], cols)


def _case(fmt: str, rows: int, cols: int, seed: int):
    rng = np.random.default_rng(seed)
    raw = random_blocks(rng, fmt, rows, cols, scale=0.05)
    q = QuantTensor([torch.from_numpy(raw)], [BY_NAME[fmt]], cols)
    q.int8 = True
    return raw, q


def _cols(fmt: str) -> list[int]:
    # 32-weight formats: whole 64-weight steps and an odd number of blocks (the zero block's tail)
    return [256, 512] if FORMATS[BY_NAME[fmt]][1] == 256 else [96, 512]


@pytest.mark.parametrize("fmt", INT8_NAMES)
def test_int8_products_are_the_defined_arithmetic(fmt):
    """Against float64 of (dequantised weights) @ (q * d): every product within float32 rounding of
    the reference, relative to the sum of its terms' magnitudes."""
    k = rowwise.kernel()
    for cols in _cols(fmt):
        raw, q = _case(fmt, 37, cols, seed=cols)
        x = torch.randn(9, cols, generator=torch.Generator().manual_seed(cols)) * 3
        x[2, :32] = 0.0  # a block of zeros: d = 0, q = 0
        x[3, 5] = 40.0  # one large value dominates its block
        w, xq = _dequantised(raw, fmt, cols), _quantised_x(x)
        ref, scale = xq @ w.T, np.abs(xq) @ np.abs(w).T
        got = k.weight_mm(x, q.arg).numpy().astype(np.float64)
        err = np.abs(got - ref) / scale
        assert err.max() < 2e-6, f"{fmt} cols {cols}: relative error {err.max():.2e}"


@pytest.mark.parametrize("fmt", INT8_NAMES)
def test_int8_products_are_the_same_bits_on_every_variant_and_for_any_neighbours(fmt):
    variants = [rowwise.load_variant(v) for v in rowwise.supported_variants()]
    for cols in _cols(fmt):
        raw, q = _case(fmt, 21, cols, seed=7)
        x = torch.randn(11, cols, generator=torch.Generator().manual_seed(5))
        first = None
        for k in variants:
            alone = torch.cat([k.weight_mm(x[r : r + 1], q.arg) for r in range(11)])
            for n in (2, 3, 8, 11):
                assert torch.equal(k.weight_mm(x[:n], q.arg), alone[:n]), f"{fmt}: rows moved with neighbours on {k.variant()}"
            if first is None:
                first = alone
            assert torch.equal(alone, first), f"{fmt}: {k.variant()} differs from {variants[0].variant()}"


def test_int8_is_a_different_arithmetic_from_exact():
    """Negative control: the int8 products are not the exact float32 ones (so the model-level
    checks below compare int8 with int8), yet close to them (quantisation noise of ~1%)."""
    raw, q = _case("Q4_K", 64, 512, seed=3)
    exact = QuantTensor(q.parts, q.types, 512)
    x = torch.randn(4, 512, generator=torch.Generator().manual_seed(2))
    k = rowwise.kernel()
    a, b = k.weight_mm(x, q.arg), k.weight_mm(x, exact.arg)
    assert not torch.equal(a, b)
    assert (a - b).norm() / b.norm() < 0.02
    assert q.arg[1] == [12 + INT8] and exact.arg[1] == [12]


def test_the_reference_sees_a_wrong_rounding():
    """Negative control for the reference check: quantising x with round-half-away (another
    plausible choice) instead of round-half-even is caught on values that land on .5."""
    x = torch.tensor([[i + 0.5 for i in range(31)] + [127.0]])  # a = 127, d = 1: x * 127 / a = i + 0.5 exactly
    even = _quantised_x(x)
    away = np.floor(x.numpy().astype(np.float64) + 0.5)
    assert not np.array_equal(even, away)
    w = np.ones((1, 32))
    raw = np.concatenate([np.frombuffer(np.float16(1.0).tobytes(), np.uint8), np.ones(32, np.uint8)])[None]  # Q8_0: w = 1
    q = QuantTensor([torch.from_numpy(np.ascontiguousarray(raw))], [BY_NAME["Q8_0"]], 32)
    q.int8 = True
    got = rowwise.kernel().weight_mm(x, q.arg).item()
    assert got == pytest.approx(float((even @ w.T).item()), abs=1e-4)
    assert got != pytest.approx(float((away @ w.T).item()), abs=1e-4)


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    folder = tmp_path_factory.mktemp("synth8")
    return write(folder / "tiny-q4_k_m.gguf", SIZES["tiny"], "q4_k_m", seed=11, progress=False)


def test_speculative_output_on_int8_is_its_plain_decoding(synthetic):
    from verispec import LLM, SamplingParams

    path = str(synthetic)
    prompts = [list(range(3, 40)) * 2, [5, 6, 7, 8] * 5]  # a prompt (74 tokens) and a short one (20: decoding rows)
    params = SamplingParams(max_tokens=40, temperature=0.0)
    plain = [o.outputs[0].token_ids for o in LLM(path, weights_format="gguf-int8").generate(prompts, params)]
    for spec in ({"method": "prompt_lookup", "num_speculative_tokens": 4, "adaptive_k": False},
                 {"method": "draft_model", "draft_model": path, "num_speculative_tokens": 3, "adaptive_k": False}):
        outs = LLM(path, weights_format="gguf-int8", speculative=spec).generate(prompts, params)
        assert [o.outputs[0].token_ids for o in outs] == plain, spec["method"]


def test_int8_runner_verifies_rows_as_it_decodes_them(synthetic):
    from verispec.runners.registry import RunnerConfig, build_runner

    path = str(synthetic)
    i8 = build_runner("torch", RunnerConfig(path, weights_format="gguf-int8"))
    ex = build_runner("torch", RunnerConfig(path, weights_format="gguf"))
    # the same blocks (Q4_K tiles hold their scales unpacked to bytes: +2.8% of those matrices)
    assert i8.weights_format == "gguf-int8" and ex.weight_bytes <= i8.weight_bytes <= ex.weight_bytes * 1.03
    prompt = list(range(3, 70))  # 67 tokens: the layers run the exact prompt path; the head's one row, int8
    sa, sb = i8.open(128), ex.open(128)
    la, lb = i8.forward(sa, prompt).logits, ex.forward(sb, prompt).logits
    tok = [int(la[-1].argmax())]
    da, db = i8.forward(sa, tok).logits, ex.forward(sb, tok).logits
    for a, b in ((la, lb), (da, db)):  # another arithmetic, close to the exact one
        assert not torch.equal(a, b) and torch.corrcoef(torch.stack([a[-1], b[-1]]))[0, 1] > 0.999
    # a 5-row verification gives each row what decoding it alone gives
    draft = [7, 8, 9, 10, 11]
    rows = i8.forward(sa, draft, num_logits=5).logits
    sc = i8.open(128)
    i8.forward(sc, prompt)
    i8.forward(sc, tok)
    for j, t in enumerate(draft):
        assert torch.equal(i8.forward(sc, [t]).logits[-1], rows[j]), f"row {j}"


def test_int8_formats_are_the_ones_the_kernel_defines():
    """INT8_FORMATS (which parts QuantTensor flags) is what quant8.h defines: the kernel multiplies
    each of them with int8 activations and refuses the flag on every other block format."""
    k = rowwise.kernel()
    if k is None:
        pytest.skip("no row-wise kernel")
    rng = np.random.default_rng(0)
    x = torch.randn(1, 256)
    for t, (name, _, nbytes) in FORMATS.items():
        if t == 0:
            continue
        raw = torch.from_numpy(rng.integers(0, 256, size=(4, 256 // FORMATS[t][1] * nbytes), dtype=np.uint8))
        if t in INT8_FORMATS:
            assert k.weight_mm(x, ([raw], [t + INT8])).shape == (1, 4), name
        else:
            with pytest.raises(RuntimeError, match="no int8-activation products"):
                k.weight_mm(x, ([raw], [t + INT8]))


def test_int8_needs_blocks(tiny_dir):
    from verispec.runners.registry import RunnerConfig, build_runner
    from verispec.errors import ConfigError

    with pytest.raises(ConfigError, match="needs a .gguf model"):
        build_runner("torch", RunnerConfig(str(tiny_dir("llama")), weights_format="gguf-int8"))


def test_bundled_model_speculative_greedy_on_int8_is_its_plain_greedy():
    from verispec import LLM, SamplingParams

    llm = LLM("smollm2-135m", weights_format="gguf-int8")
    prompts = ["Write three short facts about the moon.", "List the days of the week, one per line."]
    params = SamplingParams(max_tokens=48, temperature=0.0)
    plain = [o.outputs[0].token_ids for o in llm.chat([[{"role": "user", "content": p}] for p in prompts], params)]
    spec = LLM("smollm2-135m", weights_format="gguf-int8",
               speculative={"method": "prompt_lookup", "num_speculative_tokens": 5, "adaptive_k": False})
    got = [o.outputs[0].token_ids for o in spec.chat([[{"role": "user", "content": p}] for p in prompts], params)]
    assert got == plain and all(len(t) == 48 for t in plain)


def test_int8_rows_with_non_finite_values_give_the_same_bits_on_every_variant():
    """x's blocks are scaled by their largest |x| (int8.h's max_abs32: vector instructions on the
    x86 variants, a loop on the others): a block with a NaN or an infinity makes the row's products
    NaN (not quietly finite), negative zeros and a lone large value do not, and every variant
    gives the same bits (NaN payloads included)."""
    variants = [rowwise.load_variant(v) for v in rowwise.supported_variants()]
    raw, q = _case("Q8_0", 19, 96, seed=3)
    x = torch.randn(5, 96, generator=torch.Generator().manual_seed(1))
    x[0, 7] = float("nan")
    x[1, 40] = float("inf")
    x[2, 64:96] = -0.0
    x[3, 33] = -1e30
    x[4, 0], x[4, 31] = float("nan"), 1e6  # a NaN beside the block's largest finite value
    outs = [k.weight_mm(x, q.arg) for k in variants]
    for k, y in zip(variants[1:], outs[1:]):
        assert torch.equal(y.view(torch.int32), outs[0].view(torch.int32)), f"{k.variant()} differs from {variants[0].variant()}"
    assert torch.isfinite(outs[0][2]).all() and torch.isfinite(outs[0][3]).all()
    for r in (0, 1, 4):
        assert torch.isnan(outs[0][r]).all(), f"row {r}: a non-finite activation must show in every product"


# The 32-weight formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0): per-block float work (kernels/tile8.h), over the file's rows or over tiles of 16

TILE_NAMES = sorted(FORMATS[t][0] for t in TILE_FORMATS)


def _fma32(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """float32 fused multiply-add: a * b is exact in float64 (two 24-bit significands), then the
    sum rounded to float64 and to float32 (a double rounding that differs from one rounding only on
    rare exact ties; these fixed seeds have none, or the bit comparison below would say so)."""
    return (a.astype(np.float64) * b.astype(np.float64) + c.astype(np.float64)).astype(np.float32)


def _block_weights(raw: np.ndarray, fmt: str, cols: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """A 32-weight format's rows as (w int64 [rows, blocks, 32] (offset taken off), ws float32
    [rows, blocks], wm float32 [rows, blocks] or None)."""
    rows, nb, nbytes = raw.shape[0], cols // 32, FORMATS[BY_NAME[fmt]][2]
    blk = raw.reshape(rows, nb, nbytes)
    with_min = fmt in ("Q4_1", "Q5_1")
    ws = blk[:, :, 0:2].copy().view(np.float16)[..., 0].astype(np.float32)  # [rows, nb]
    wm = blk[:, :, 2:4].copy().view(np.float16)[..., 0].astype(np.float32) if with_min else None
    head = 4 if with_min else 2
    if fmt == "Q8_0":
        w = blk[:, :, 2:].view(np.int8).astype(np.int64)
    else:
        five = fmt.startswith("Q5")
        qs = blk[:, :, head + (4 if five else 0):].astype(np.int64)
        w = np.concatenate([qs & 15, qs >> 4], axis=2)  # [rows, nb, 32]
        if five:
            qh = blk[:, :, head : head + 4].copy().view(np.uint32).astype(np.int64)  # [rows, nb, 1]
            w = w | (((qh >> np.arange(32)) & 1) << 4)
        w = w - (0 if with_min else 16 if five else 8)
    return w, ws, wm


def _blockwise_reference(raw: np.ndarray, fmt: str, x: torch.Tensor) -> np.ndarray:
    """tile8.h's arithmetic in numpy, bit for bit: x quantised per 32 values (d = a / 127,
    q = round-half-even(x * (127 / a)), S = sum q); per block in order acc = fma(float(i), ws * d,
    acc), then (Q4_1, Q5_1) acc = fma(wm, d * float(S), acc), i = sum of w * q in integers."""
    w, ws, wm = _block_weights(raw, fmt, x.shape[1])
    q, d = _x_blocks(x)  # [R, nb, 32], [R, nb]
    sxb = (d * q.sum(axis=2).astype(np.float32)).astype(np.float32)
    acc = np.zeros((x.shape[0], raw.shape[0]), np.float32)
    for b in range(w.shape[1]):
        i = (q[:, b, :] @ w[:, b, :].T).astype(np.float32)  # [R, rows], exact integers
        acc = _fma32(i, (ws[None, :, b] * d[:, b, None]).astype(np.float32), acc)
        if wm is not None:
            acc = _fma32(np.broadcast_to(wm[None, :, b], acc.shape), np.broadcast_to(sxb[:, b, None], acc.shape), acc)
    return acc


def _k_parts(raw: np.ndarray, fmt: str, cols: int):
    """A K-quant's rows per 32-weight block of x: (u int64 [rows, nb, 32], the unsigned quants;
    Q4_K: ws = d * float(sc_j), wm = (0 - dmin) * float(m_j), float32 [rows, nb];
    Q6_K: ws float32 [rows, nb, 2], d * float(sc) of the block's two 16-weight halves)."""
    rows, ns = raw.shape[0], cols // 256
    blk = raw.reshape(rows, ns, -1).astype(np.int64)
    if fmt == "Q4_K":
        d = raw.reshape(rows, ns, -1)[:, :, 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
        dmin = raw.reshape(rows, ns, -1)[:, :, 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
        q = blk[:, :, 4:16]
        sc = np.zeros((rows, ns, 8), np.int64)
        m = np.zeros((rows, ns, 8), np.int64)
        for j in range(8):
            if j < 4:
                sc[:, :, j], m[:, :, j] = q[:, :, j] & 63, q[:, :, j + 4] & 63
            else:
                sc[:, :, j] = (q[:, :, j + 4] & 15) | ((q[:, :, j - 4] >> 6) << 4)
                m[:, :, j] = (q[:, :, j + 4] >> 4) | ((q[:, :, j] >> 6) << 4)
        qs = blk[:, :, 16:144]
        u = np.stack([(qs[:, :, 32 * (j // 2): 32 * (j // 2) + 32] >> (4 * (j % 2))) & 15 for j in range(8)], axis=2)
        ws = (d[..., None] * sc.astype(np.float32)).astype(np.float32)
        wm = ((np.float32(0) - dmin)[..., None] * m.astype(np.float32)).astype(np.float32)
        return u.reshape(rows, ns * 8, 32), ws.reshape(rows, ns * 8), wm.reshape(rows, ns * 8)
    d = raw.reshape(rows, ns, -1)[:, :, 208:210].copy().view(np.float16)[..., 0].astype(np.float32)
    sc = raw.reshape(rows, ns, -1)[:, :, 192:208].view(np.int8).astype(np.float32)  # [rows, ns, 16]
    k = np.arange(256)
    h, r, l = k // 128, k % 128 // 32, k % 32
    lo = blk[:, :, 64 * h + 32 * (r & 1) + l]
    lo = np.where(r < 2, lo & 15, lo >> 4)
    u = lo | (((blk[:, :, 128 + 32 * h + l] >> (2 * r)) & 3) << 4)
    ws = (d[..., None] * sc).astype(np.float32)  # [rows, ns, 16]
    return u.reshape(rows, ns * 8, 32), ws.reshape(rows, ns * 8, 2), None


def _k_reference(raw: np.ndarray, fmt: str, x: torch.Tensor) -> np.ndarray:
    """ktile8.h's arithmetic in numpy, bit for bit: per 32-weight block b of x in order, Q4_K
    acc = fma(float(i), ws * d, acc) then acc = fma(wm, d * float(S), acc); Q6_K for each half h
    acc = fma(float(i_h - 32 * S_h), ws_h * d, acc) (i: integer sums of u * q)."""
    u, ws, wm = _k_parts(raw, fmt, x.shape[1])
    q, d = _x_blocks(x)  # [R, nb, 32], [R, nb]
    acc = np.zeros((x.shape[0], raw.shape[0]), np.float32)
    for b in range(u.shape[1]):
        if fmt == "Q4_K":
            i = (q[:, b, :] @ u[:, b, :].T).astype(np.float32)
            acc = _fma32(i, (ws[None, :, b] * d[:, b, None]).astype(np.float32), acc)
            sxb = (d[:, b] * q[:, b, :].sum(axis=1).astype(np.float32)).astype(np.float32)
            acc = _fma32(np.broadcast_to(wm[None, :, b], acc.shape), np.broadcast_to(sxb[:, None], acc.shape), acc)
        else:
            for h in range(2):
                half = slice(16 * h, 16 * h + 16)
                i = q[:, b, half] @ u[:, b, half].T - 32 * q[:, b, half].sum(axis=1)[:, None]
                acc = _fma32(i.astype(np.float32), (ws[None, :, b, h] * d[:, b, None]).astype(np.float32), acc)
    return acc


def _tile_reference(raw: np.ndarray, fmt: str, x: torch.Tensor) -> np.ndarray:
    return _k_reference(raw, fmt, x) if fmt in ("Q4_K", "Q6_K") else _blockwise_reference(raw, fmt, x)


def _tile_cols(fmt: str) -> tuple[int, int]:
    return (256, 512) if fmt in ("Q4_K", "Q6_K") else (96, 512)


def _tiled(raw: np.ndarray, fmt: str, cols: int) -> QuantTensor:
    q = QuantTensor([torch.from_numpy(raw)], [BY_NAME[fmt]], cols)
    q.tile_int8()
    return q


@pytest.mark.parametrize("fmt", TILE_NAMES)
def test_blockwise_products_are_their_arithmetic_bit_for_bit_in_both_layouts(fmt):
    """The file's rows and the tiles (37 rows: two tiles and 5 rows past them) give tile8.h's
    arithmetic exactly, on every variant, for any number of rows beside a row."""
    variants = [rowwise.load_variant(v) for v in rowwise.supported_variants()]
    for cols in _tile_cols(fmt):
        raw, rows_layout = _case(fmt, 37, cols, seed=cols + 1)
        tiles = _tiled(raw, fmt, cols)
        assert [p.dim() for p in tiles.parts] == [3, 2] and tiles.parts[0].shape[:2] == (2, cols // FORMATS[BY_NAME[fmt]][1])
        x = torch.randn(11, cols, generator=torch.Generator().manual_seed(cols)) * 2
        x[2, :32] = 0.0
        x[3, 5] = 40.0
        want = _tile_reference(raw, fmt, x)
        for k in variants:
            for q in (rows_layout, tiles):
                got = k.weight_mm(x, q.arg).numpy()
                assert np.array_equal(got.view(np.int32), want.view(np.int32)), \
                    f"{fmt} cols {cols} on {k.variant()}: {np.abs(got - want).max():.3e} from the reference"
            alone = torch.cat([k.weight_mm(x[r : r + 1], tiles.arg) for r in range(11)])
            for n in (2, 3, 8, 11):
                assert torch.equal(k.weight_mm(x[:n], tiles.arg), alone[:n]), f"{fmt}: rows moved with neighbours on {k.variant()}"


def test_the_blockwise_reference_sees_scales_applied_per_group():
    """Negative control: quant8.h's other arithmetic (scales applied per 4 weights, the one these
    formats had before tile8.h) is close to the reference but not its bits."""
    raw, q = _case("Q4_1", 16, 256, seed=4)
    x = torch.randn(3, 256, generator=torch.Generator().manual_seed(3))
    want = _blockwise_reference(raw, "Q4_1", x)
    # the per-group arithmetic of these very weights, computed in numpy: lanes of 4 weights
    w, ws, wm = _block_weights(raw, "Q4_1", 256)
    xq, d = _x_blocks(x)
    lanes = np.zeros((3, 16, 8), np.float32)
    for b in range(w.shape[1]):
        for g in range(8):
            i = (xq[:, b, 4 * g : 4 * g + 4] @ w[:, b, 4 * g : 4 * g + 4].T).astype(np.float32)
            lanes[:, :, g] = _fma32(i, (ws[None, :, b] * d[:, b, None]).astype(np.float32), lanes[:, :, g])
            s = (d[:, b] * xq[:, b, 4 * g : 4 * g + 4].sum(axis=1).astype(np.float32)).astype(np.float32)
            lanes[:, :, g] = _fma32(np.broadcast_to(wm[None, :, b], (3, 16)), np.broadcast_to(s[:, None], (3, 16)), lanes[:, :, g])
    per_lane = lanes.sum(axis=2, dtype=np.float32)
    assert np.allclose(per_lane, want, rtol=1e-4, atol=1e-5) and not np.array_equal(per_lane, want)
    assert np.array_equal(rowwise.kernel().weight_mm(x, q.arg).numpy(), want)


def test_the_k_reference_sees_the_order_of_the_float_steps():
    """Negative control for the K-quants' bit comparison: the same terms with Q4_K's min step taken
    before the scale step (or Q6_K's halves in the other order) are close to the reference, not its bits."""
    for fmt in ("Q4_K", "Q6_K"):
        raw, q = _case(fmt, 16, 512, seed=6)
        x = torch.randn(3, 512, generator=torch.Generator().manual_seed(6))
        want = _k_reference(raw, fmt, x)
        assert np.array_equal(rowwise.kernel().weight_mm(x, q.arg).numpy(), want)
        u, ws, wm = _k_parts(raw, fmt, 512)
        xq, d = _x_blocks(x)
        other = np.zeros_like(want)
        for b in range(u.shape[1]):
            if fmt == "Q4_K":
                sxb = (d[:, b] * xq[:, b, :].sum(axis=1).astype(np.float32)).astype(np.float32)
                other = _fma32(np.broadcast_to(wm[None, :, b], other.shape), np.broadcast_to(sxb[:, None], other.shape), other)
                i = (xq[:, b, :] @ u[:, b, :].T).astype(np.float32)
                other = _fma32(i, (ws[None, :, b] * d[:, b, None]).astype(np.float32), other)
            else:
                for h in (1, 0):
                    half = slice(16 * h, 16 * h + 16)
                    i = xq[:, b, half] @ u[:, b, half].T - 32 * xq[:, b, half].sum(axis=1)[:, None]
                    other = _fma32(i.astype(np.float32), (ws[None, :, b, h] * d[:, b, None]).astype(np.float32), other)
        assert np.allclose(other, want, rtol=1e-4, atol=1e-5) and not np.array_equal(other, want), fmt


@pytest.mark.parametrize("fmt", TILE_NAMES)
def test_tiles_unpack_to_the_file_values(fmt):
    """A tiled matrix's rows (embedding lookups, prompt processing) are the file's values exactly."""
    cols = _tile_cols(fmt)[0]
    raw, exact = _case(fmt, 40, cols, seed=9)
    exact.int8 = False
    tiles = _tiled(raw, fmt, cols)
    assert torch.equal(tiles.dequantize(), exact.dequantize())
    ids = torch.tensor([0, 15, 16, 31, 32, 39, 7])
    assert torch.equal(tiles.take(ids), exact.take(ids))
    # Q4_K's tiles hold its 6-bit scales and mins unpacked to bytes: 2368 bytes a tile block for 16 x 144
    assert tiles.nbytes == exact.nbytes if fmt != "Q4_K" else exact.nbytes < tiles.nbytes <= exact.nbytes * 1.03


def test_tiles_refuse_what_they_cannot_hold():
    k = rowwise.kernel()
    with pytest.raises(RuntimeError, match="has no tiles"):
        k.tile_weight(torch.zeros(16, 176, dtype=torch.uint8), BY_NAME["Q5_K"])
    with pytest.raises(RuntimeError, match="multiple of 16"):
        k.tile_weight(torch.zeros(17, 20, dtype=torch.uint8), BY_NAME["Q4_1"])
    tiles = k.tile_weight(torch.zeros(16, 20, dtype=torch.uint8), BY_NAME["Q4_1"])
    with pytest.raises(RuntimeError, match="tiled part"):  # tiles without the int8 flag
        k.weight_mm(torch.zeros(1, 32), ([tiles], [BY_NAME["Q4_1"]]))
    with pytest.raises(RuntimeError, match="tiled part over 64 columns"):
        k.weight_mm(torch.zeros(1, 64), ([tiles], [BY_NAME["Q4_1"] + INT8]))


def test_int8_load_tiles_the_bundled_model():
    """gguf-int8 loads SmolLM2's Q4_1 and Q8_0 matrices as tiles (all their rows are whole 16s)."""
    from verispec.models.weights.registry import load_model

    loaded = load_model("smollm2-135m", blocks=True, int8=True)
    quant = [w for w in loaded.weights.values() if isinstance(w, QuantTensor)]
    assert quant and all(w.int8 and all(p.dim() == 3 for p in w.parts) for w in quant)


def test_tiling_in_chunks_gives_the_same_tiles_and_reports_what_it_read():
    """tile_int8 copies chunk_rows rows at a time (the loader drops each chunk's file pages):
    the same tiles as in one go, and read() told of every byte of the tiled rows, in order."""
    raw, _ = _case("Q4_1", 53, 96, seed=2)  # 48 rows in tiles, 5 past them
    whole, chunked = _tiled(raw, "Q4_1", 96), QuantTensor([torch.from_numpy(raw)], [BY_NAME["Q4_1"]], 96)
    seen = []
    chunked.tile_int8(read=lambda i, a, b: seen.append((i, a, b)), chunk_rows=16)
    assert all(torch.equal(a, b) for a, b in zip(whole.parts, chunked.parts)) and len(chunked.parts) == 2
    rb = raw.shape[1]
    assert seen == [(0, 0, 16 * rb), (0, 16 * rb, 32 * rb), (0, 32 * rb, 48 * rb)]


def test_eagle3_on_int8_drafts_with_an_int8_head_and_stays_exact():
    """A target on gguf-int8 gets an EAGLE head whose products are int8 too (its matrices rounded to
    Q8_0 tiles), for catch-ups over many states as for drafting steps: close to the float16 head's
    logits, not the same, and the speculative output is still the target's plain decoding."""
    from verispec import LLM, SamplingParams
    from verispec.runners.registry import RunnerConfig, build_runner
    from verispec.models.heads.eagle import KERNEL_ROWS, TILED_KERNEL_ROWS, EagleHead
    from verispec.models.heads.eagle_io import load_head
    from verispec.proposers.eagle import bundled_head

    target = build_runner("torch", RunnerConfig("smollm2-135m", weights_format="gguf-int8"))
    hc, w = load_head(bundled_head(target), target.config.hidden_size, target.vocab_size)
    heads = [EagleHead(hc, w, target.embed, None, int8=i8) for i8 in (False, True)]
    assert heads[1].products["lm_head"][0][1] == [8 + INT8] and heads[0].products["lm_head"][0][1] != [8 + INT8]
    states = torch.randn(4, 3 * target.config.hidden_size, generator=torch.Generator().manual_seed(0))
    tokens = torch.tensor([5, 17, 200, 31])
    a, b = (h.forward(states, tokens, h.new_cache(16), True)[0] for h in heads)
    assert not torch.equal(a, b)
    assert torch.nn.functional.cosine_similarity(a, b, dim=-1).min() > 0.99
    # a catch-up longer than a drafting step (40 states, as a prompt's) goes through the int8 head's
    # kernel as the target's tiled prompts do; the float16 head's through torch's products
    assert heads[0].kernel_rows == KERNEL_ROWS < 40 < heads[1].kernel_rows == TILED_KERNEL_ROWS

    class Counting:  # the kernel, counting the rows of each product
        def __init__(self, kernel):
            self.kernel, self.rows = kernel, []

        def weight_mm(self, x, weight):
            self.rows.append(x.shape[0])
            return self.kernel.weight_mm(x, weight)

    g = torch.Generator().manual_seed(1)
    long_states, long_tokens = torch.randn(40, 3 * target.config.hidden_size, generator=g), torch.randint(3, 1000, (40,), generator=g)
    for h in heads:
        h.kernel = Counting(h.kernel)
    a, b = (h.forward(long_states, long_tokens, h.new_cache(48), True, logit_rows=1)[0] for h in heads)
    assert heads[0].kernel.rows == [1] and set(heads[1].kernel.rows) == {40, 1}  # LM head: the last row only
    assert torch.nn.functional.cosine_similarity(a, b, dim=-1).min() > 0.99

    msgs = [[{"role": "user", "content": "Explain how a bicycle works."}], [{"role": "user", "content": "Write a short poem about rain."}]]
    params = SamplingParams(max_tokens=64, temperature=0.0)
    plain = [o.outputs[0].token_ids for o in LLM("smollm2-135m", weights_format="gguf-int8").chat(msgs, params)]
    spec = LLM("smollm2-135m", weights_format="gguf-int8",
               speculative={"method": "eagle3", "num_speculative_tokens": 5, "adaptive_k": False})
    assert [o.outputs[0].token_ids for o in spec.chat(msgs, params)] == plain


def test_prompts_on_a_block_model_take_the_decoding_rows_arithmetic():
    """SmolLM2's matrices are GGUF blocks on gguf-int8 (tiles) and on the exact gguf path, so its
    prompts (shorter than STACK_PROMPT_ROWS) go through the kernel's Stack: a prompt's keys, values
    and logits are bit for bit those of decoding it token by token. Control: with float32 weights a
    prompt of 48+ tokens takes another arithmetic (F.linear)."""
    from verispec.models.weights.registry import load_model
    from verispec.models.decoder.transformer import PROMPT_ROWS, STACK_PROMPT_ROWS, Transformer

    def prompt_and_tokens(tf):
        prompt = torch.arange(100) + 7
        whole, alone = tf.new_cache(128), tf.new_cache(128)
        logits = tf.forward(prompt, whole).logits
        for t in prompt:
            last = tf.forward(t[None], alone).logits
        same_kv = torch.equal(whole.keys[:, :, :100], alone.keys[:, :, :100]) and torch.equal(whole.values[:, :, :100], alone.values[:, :, :100])
        return torch.equal(logits, last), same_kv

    for int8 in (True, False):
        loaded = load_model("smollm2-135m", blocks=True, int8=int8)
        blocks = Transformer(loaded.config, loaded.weights)
        assert blocks.stack_rows == STACK_PROMPT_ROWS
        assert prompt_and_tokens(blocks) == (True, True), f"int8={int8}"
    loaded = load_model("smollm2-135m")
    dense = Transformer(loaded.config, loaded.weights)
    assert dense.stack_rows == PROMPT_ROWS
    assert prompt_and_tokens(dense) == (False, False)


def test_prefix_caching_on_an_all_tile_model_prefills_whole_prompts_and_changes_no_token():
    """SmolLM2 on gguf-int8 takes prompts through the decoding kernels whole (STACK_PROMPT_ROWS), so
    prefix caching prefills them in one forward, not in 47-row chunks; chunked prefill keeps its
    short chunks. A second turn served from the cache gives the tokens it gets without one."""
    from verispec import LLM, SamplingParams
    from verispec.models.decoder.transformer import PROMPT_ROWS
    from verispec.models.decoder.transformer import STACK_PROMPT_ROWS

    params = SamplingParams(max_tokens=48, temperature=0.0)
    turn1 = [{"role": "user", "content": "List three uses of copper, one line each, and say why for each."}]
    cached = LLM("smollm2-135m", weights_format="gguf-int8", enable_prefix_caching=True)
    assert cached.decoder.prefill_rows == STACK_PROMPT_ROWS - 1
    answer = cached.chat([turn1], params)[0].outputs[0].text
    turn2 = turn1 + [{"role": "assistant", "content": answer}, {"role": "user", "content": "Now the same for tin."}]
    out = cached.chat([turn2], params)[0]
    assert out.metrics.num_cached_prompt_tokens >= 32
    fresh = LLM("smollm2-135m", weights_format="gguf-int8")
    assert fresh.chat([turn2], params)[0].outputs[0].token_ids == out.outputs[0].token_ids
    chunked = LLM("smollm2-135m", weights_format="gguf-int8", enable_chunked_prefill=True)
    assert chunked.decoder.prefill_rows == PROMPT_ROWS - 1
