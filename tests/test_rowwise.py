"""The row-wise kernels (models/kernels/) on their own, each variant this CPU runs:
right numbers, and every row bit-identical to its one-row result whatever the rows and threads
beside it. Variants against each other: test_kernel_variants.py."""

import pytest
import torch

from verispec.models.kernels import rowwise


@pytest.fixture(scope="module", params=rowwise.supported_variants())
def kern(request):
    """Each variant this CPU runs; the build must succeed (a compiler is part of the set-up)."""
    return rowwise.load_variant(request.param)


# inputs that are and are not multiples of the 16-float blocks; outputs that are and are not
# multiples of the output blocks (8, 6, 4, 2 by row count)
SHAPES = [(1003, 77), (640, 576), (96, 16), (5, 33), (2048, 640)]


@pytest.mark.parametrize("out,inp", SHAPES)
def test_matches_a_float64_product(kern, out, inp):
    g = torch.Generator().manual_seed(out + inp)
    w, x = torch.randn(out, inp, generator=g), torch.randn(19, inp, generator=g)
    ref = x.double() @ w.double().T
    for R in (1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 19):
        y = kern.rows_mm(x[:R], w)
        assert y.shape == (R, out) and y.dtype == torch.float32
        torch.testing.assert_close(y.double(), ref[:R], atol=2e-5 * inp**0.5, rtol=1e-5)


@pytest.mark.parametrize("out,inp", SHAPES)
def test_rows_bit_identical_whatever_beside_them(kern, out, inp):
    g = torch.Generator().manual_seed(7 * out + inp)
    w, x = torch.randn(out, inp, generator=g), torch.randn(19, inp, generator=g)
    alone = torch.cat([kern.rows_mm(x[r : r + 1], w) for r in range(19)])
    threads = torch.get_num_threads()
    try:
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            for R in range(2, 20):
                y = kern.rows_mm(x[:R], w)
                assert torch.equal(y, alone[:R]), f"{R} rows, {n} threads: max diff {(y - alone[:R]).abs().max().item():.3g}"
            shifted = kern.rows_mm(x[5:12], w)  # other neighbours
            assert torch.equal(shifted, alone[5:12])
    finally:
        torch.set_num_threads(threads)


def test_non_contiguous_rows_and_bad_input(kern):
    w = torch.randn(64, 32)
    x = torch.randn(32, 6).T  # [6, 32], not contiguous
    assert torch.equal(kern.rows_mm(x, w), kern.rows_mm(x.contiguous(), w))
    with pytest.raises(RuntimeError, match="float32"):
        kern.rows_mm(x.double(), w.double())
    with pytest.raises(RuntimeError, match="x \\[R, in\\]"):
        kern.rows_mm(torch.randn(2, 31), w)
    with pytest.raises(RuntimeError, match="contiguous"):
        kern.rows_mm(x.contiguous(), torch.randn(32, 64).T)


def test_switched_off_by_environment(monkeypatch):
    rowwise.kernel()  # the chosen module in place first, so that it is put back afterwards (delitem
    # of a missing key records nothing, and the None below would stay for later tests)
    monkeypatch.setenv("VERISPEC_KERNELS", "0")
    monkeypatch.delitem(rowwise._state, "module")
    assert rowwise.kernel() is None


def reference_attention(q, keys, values, start, window, scale):
    """float64 attention of rows at positions start.. over their causal (windowed) keys: [T, H*D]."""
    T, H, D = q.shape
    group = H // keys.shape[0]
    out = torch.empty(T, H, D, dtype=torch.float64)
    for t in range(T):
        pos = start + t
        first = max(0, pos - window + 1) if window else 0
        for h in range(H):
            k, v = keys[h // group, first : pos + 1].double(), values[h // group, first : pos + 1].double()
            p = torch.softmax(scale * (k @ q[t, h].double()), dim=0)
            out[t, h] = p @ v
    return out.reshape(T, H * D)


@pytest.mark.parametrize("H,KVH,D,window", [(4, 1, 256, 0), (9, 3, 64, 0), (4, 2, 24, 5), (2, 2, 8, 40)])
def test_attention_matches_float64_and_rows_stand_alone(kern, H, KVH, D, window):
    g = torch.Generator().manual_seed(H * D + window)
    A, start, T = 80, 37, 9
    keys, values = torch.randn(KVH, A, D, generator=g), torch.randn(KVH, A, D, generator=g)
    q = 3 * torch.randn(T, H, D, generator=g)  # peaked softmaxes too
    scale = D**-0.5
    out = kern.attention_rows(q, keys, values, start, window, scale)
    assert out.shape == (T, H * D)
    torch.testing.assert_close(out.double(), reference_attention(q, keys, values, start, window, scale), atol=1e-5, rtol=1e-5)
    for t in range(T):  # each row alone, as a one-token decode at its position computes it
        assert torch.equal(kern.attention_rows(q[t : t + 1], keys, values, start + t, window, scale), out[t : t + 1])
    with pytest.raises(RuntimeError, match="beyond the cache"):
        kern.attention_rows(q, keys, values, A - 2, window, scale)


def test_the_stack_checks_its_input(tiny_dir):
    """The one-call forward (kernels/layer.cpp's Stack) refuses what it cannot run, with a message,
    before its parallel region (where an error could not be raised): rows that do not start at 0,
    a cache of the wrong shape, a captured layer or a logit row out of range, a layer of other sizes."""
    from verispec.models.weights.registry import load_model
    from verispec.models.decoder.transformer import Transformer, _kernel_weight

    loaded = load_model(str(tiny_dir("llama")))
    m = Transformer(loaded.config, loaded.weights)
    if m._stack is None:
        pytest.skip("the row-wise kernels do not build here")
    c, stack = m.config, m._stack
    cache = m.new_cache(16)
    x = torch.randn(2, c.hidden_size)
    cos, sin = m.rope.get(0, 2)

    def call(rows=(0,), keys=None, capture=(), logit_rows=(1,)):
        return stack.forward(x, cos, sin, cos, sin, [cache.keys if keys is None else keys], [cache.values], list(rows), [0],
                             [None], list(capture), list(logit_rows))

    h, logits, streams = call(capture=(1,))
    assert h.shape == (2, c.hidden_size) and logits.shape == (1, c.vocab_size) and streams[0].shape == (2, c.hidden_size)
    with pytest.raises(RuntimeError, match="starts at row 0"):
        call(rows=(1,))
    with pytest.raises(RuntimeError, match="contiguous float32 caches"):
        call(keys=cache.keys[:1])
    with pytest.raises(RuntimeError, match="capture layer 9 out of range"):
        call(capture=(9,))
    with pytest.raises(RuntimeError, match="logit row 2 out of range"):
        call(logit_rows=(2,))
    L = m.layers[0]
    small = torch.ones(c.hidden_size // 2)
    with pytest.raises(RuntimeError, match="same sizes"):
        stack.add_layer(small, _kernel_weight(L.qkv), None, None, _kernel_weight(L.o), None, small,
                        _kernel_weight(L.gate_up), _kernel_weight(L.down), None, 0, False)
