"""The kernel variants against each other: every variant this CPU runs (avx512, avx2, scalar on
x86-64; neon, scalar on AArch64) gives bit-identical products, attention and whole forwards, so a
request's tokens do not depend on which variant a machine picks. Also: the choice by CPU features
and VERISPEC_KERNEL_VARIANT, the pinned floating-point mode, the build cache's key."""

import pytest
import torch

from verispec import LLM
from verispec.runners.base import BatchItem
from verispec.models.kernels import rowwise

SUPPORTED = rowwise.supported_variants()


@pytest.fixture(scope="module")
def kernels():
    return {v: rowwise.load_variant(v) for v in SUPPORTED}


@pytest.mark.parametrize("variant", rowwise.VARIANTS)
def test_every_variant_this_cpu_runs_builds(variant):
    if variant not in SUPPORTED:
        pytest.skip(f"this CPU lacks {variant} (it runs {', '.join(SUPPORTED)})")
    assert rowwise.load_variant(variant).variant() == variant


def test_scalar_runs_everywhere_and_the_best_is_chosen(monkeypatch):
    assert SUPPORTED[-1] == "scalar"
    monkeypatch.delenv("VERISPEC_KERNEL_VARIANT", raising=False)
    assert rowwise.chosen_variant() == SUPPORTED[0]
    monkeypatch.setenv("VERISPEC_KERNEL_VARIANT", "scalar")
    assert rowwise.chosen_variant() == "scalar"
    monkeypatch.setenv("VERISPEC_KERNEL_VARIANT", "sse9")
    with pytest.raises(rowwise.KernelVariantError, match="not one of"):
        rowwise.chosen_variant()
    unsupported = [v for v in rowwise.VARIANTS if v not in SUPPORTED]
    for v in unsupported:  # neon on x86-64, the x86 variants on AArch64
        monkeypatch.setenv("VERISPEC_KERNEL_VARIANT", v)
        with pytest.raises(rowwise.KernelVariantError, match="this CPU runs only"):
            rowwise.chosen_variant()
        with pytest.raises(rowwise.KernelVariantError, match="cannot run on this CPU"):
            rowwise.load_variant(v)


def test_cpu_features_pick_the_variants(monkeypatch):
    monkeypatch.setattr(rowwise.platform, "machine", lambda: "x86_64")
    for flags, expected in [({"avx512f", "avx512bw", "avx2", "fma", "f16c"}, ("avx512", "avx2", "scalar")),
                            ({"avx512f", "avx2", "fma", "f16c"}, ("avx2", "scalar")),  # no BW: the int8 products need it
                            ({"avx2", "fma", "f16c", "sse4_2"}, ("avx2", "scalar")),
                            ({"avx2", "fma"}, ("scalar",)),  # no F16C: the GGUF blocks' scales need it
                            ({"avx2"}, ("scalar",)), ({"sse2"}, ("scalar",))]:
        monkeypatch.setattr(rowwise, "cpu_flags", lambda f=flags: f)
        rowwise.supported_variants.cache_clear()
        assert rowwise.supported_variants() == expected
    monkeypatch.setattr(rowwise.platform, "machine", lambda: "aarch64")
    rowwise.supported_variants.cache_clear()
    assert rowwise.supported_variants() == ("neon", "scalar")
    monkeypatch.undo()
    rowwise.supported_variants.cache_clear()


def test_build_key_follows_variant_and_environment(monkeypatch):
    keys = {v: rowwise.build_key(v) for v in rowwise.VARIANTS}
    assert len(set(keys.values())) == len(keys)
    assert rowwise.build_key("avx2") == keys["avx2"]  # stable: a second process finds the same build
    monkeypatch.setattr(rowwise.build.sys, "prefix", "/another/venv")
    assert rowwise.build_key("avx2") != keys["avx2"]  # another environment builds its own


def _assert_all_equal(results: dict, what: str):
    ref_name, ref = next(iter(results.items()))
    for name, y in results.items():
        assert torch.equal(y, ref), f"{what}: {name} differs from {ref_name} by up to {(y - ref).abs().max().item():.3g}"


@pytest.mark.parametrize("out,inp", [(1003, 77), (96, 16), (5, 33), (640, 576), (37, 1)])
def test_products_bit_identical_across_variants(kernels, out, inp):
    g = torch.Generator().manual_seed(out * inp)
    w, x = torch.randn(out, inp, generator=g), torch.randn(11, inp, generator=g)
    for R in (1, 3, 8, 11):
        _assert_all_equal({v: k.rows_mm(x[:R], w) for v, k in kernels.items()}, f"rows_mm {R}x{inp} @ {out}")


@pytest.mark.parametrize("H,KVH,D,window", [(4, 1, 64, 0), (9, 3, 24, 5), (2, 2, 8, 0), (4, 1, 256, 0), (8, 2, 128, 20), (3, 3, 48, 0)])
def test_attention_bit_identical_across_variants(kernels, H, KVH, D, window):
    g = torch.Generator().manual_seed(H + D + window)
    keys, values = torch.randn(KVH, 50, D, generator=g), torch.randn(KVH, 50, D, generator=g)
    q = 4 * torch.randn(7, H, D, generator=g)  # peaked: exp's whole range
    _assert_all_equal({v: k.attention_rows(q, keys, values, 30, window, D**-0.5) for v, k in kernels.items()}, "attention")


def _argmax_rows_cases() -> list[torch.Tensor]:
    """Rows that try argmax's rule: ties (small integers), a NaN (the first one wins), infinities,
    -0 beside +0, every width around the 16-lane blocks, SmolLM2's and Gemma 3's vocabularies."""
    g = torch.Generator().manual_seed(0)
    cases = []
    for width in (1, 2, 15, 16, 17, 31, 33, 49152, 262144):
        x = torch.randint(0, 4, (4, width), generator=g).float()  # many ties
        cases.append(x)
        y = torch.randn(5, width, generator=g)
        y[0, -1] = float("nan")
        y[1, width // 2] = float("inf")
        y[1, -1] = float("inf")
        y[2] = float("-inf")
        y[3] = 0.0
        y[3, width // 3] = -0.0
        y[4, 0] = float("nan")
        if width > 2:
            y[4, 1] = float("nan")
        cases.append(y)
    cases.append(torch.full((2, 40), float("nan")))
    cases.append(torch.randn(6, 262144, generator=g))
    cases.append(torch.randn(3, 1000, generator=g)[:, ::2])  # not contiguous
    return cases


def test_row_argmax_is_torch_argmax_on_every_variant(kernels):
    """rows_argmax (the greedy choice of every verified row) gives torch.argmax's index, on
    every variant: a wrong tie-break or NaN rule would change greedy outputs."""
    for x in _argmax_rows_cases():
        want = x.argmax(dim=-1)
        for v, k in kernels.items():
            got = k.rows_argmax(x)
            assert got.dtype == torch.int64 and torch.equal(got, want), (v, x.shape, got.tolist(), want.tolist())
    # the engine's helper takes the kernel's answer, and torch's where the kernel does not apply
    assert torch.equal(rowwise.argmax_rows(torch.tensor([[1.0, 3.0, 3.0]])), torch.tensor([1]))
    assert torch.equal(rowwise.argmax_rows(torch.tensor([[1, 3, 3]], dtype=torch.float64)), torch.tensor([1]))
    with pytest.raises(RuntimeError, match="rows_argmax"):
        next(iter(kernels.values())).rows_argmax(torch.zeros(2, 3, 4))


def test_flush_to_zero_set_by_the_caller_changes_nothing(kernels):
    """Denormal inputs and products: each kernel pins its floating-point mode, so torch's
    set_flush_denormal (which sets FTZ / DAZ on this thread) cannot change a result."""
    g = torch.Generator().manual_seed(1)
    w = torch.randn(64, 48, generator=g) * 1e-20
    x = torch.randn(3, 48, generator=g) * 1e-20  # products ~1e-40: denormal
    plain = {v: k.rows_mm(x, w) for v, k in kernels.items()}
    assert (plain[SUPPORTED[0]] != 0).any()
    if not torch.set_flush_denormal(True):
        pytest.skip("this CPU cannot flush denormals (no SSE3)")
    try:
        flushed = {v: k.rows_mm(x, w) for v, k in kernels.items()}
    finally:
        torch.set_flush_denormal(False)
    for v in kernels:
        assert torch.equal(flushed[v], plain[v]), v
    _assert_all_equal(plain, "denormal products")


def _forwards(path: str, prompt: list[int], new: list[int]) -> torch.Tensor:
    """Logits of a one-token decode, an 8-row verification and a ragged batch beside it."""
    runner = LLM(path).runner
    seq, other = runner.open(len(prompt) + len(new)), runner.open(64)
    runner.forward(seq, prompt)
    one = runner.forward(seq, new[:1]).logits
    runner.truncate(seq, len(prompt))
    eight = runner.forward(seq, new, num_logits=len(new)).logits
    runner.truncate(seq, len(prompt))
    batch = runner.forward_batch([BatchItem(other, prompt[:9]), BatchItem(seq, new[:3], num_logits=3)])
    runner.close(seq)
    runner.close(other)
    return torch.cat([one, eight, batch[0].logits, batch[1].logits])


@pytest.mark.parametrize("family", ["llama", "qwen2", "gemma3"])
def test_tiny_model_forwards_bit_identical_across_variants(tiny_dir, family, monkeypatch):
    path = str(tiny_dir(family, seed=0))
    g = torch.Generator().manual_seed(5)
    prompt, new = torch.randint(3, 96, (21,), generator=g).tolist(), torch.randint(3, 96, (8,), generator=g).tolist()
    results = {}
    for v in SUPPORTED:
        monkeypatch.setitem(rowwise._state, "module", rowwise.load_variant(v))
        results[v] = _forwards(path, prompt, new)
    _assert_all_equal(results, f"tiny {family} forwards")


def test_smollm2_forwards_bit_identical_across_variants(monkeypatch):
    g = torch.Generator().manual_seed(6)
    prompt, new = torch.randint(3, 49152, (30,), generator=g).tolist(), torch.randint(3, 49152, (8,), generator=g).tolist()
    results = {}
    for v in SUPPORTED:
        monkeypatch.setitem(rowwise._state, "module", rowwise.load_variant(v))
        results[v] = _forwards("smollm2-135m", prompt, new)
    _assert_all_equal(results, "SmolLM2 forwards")


def test_no_vector_variant_means_mkl_unless_the_reference_is_forced(monkeypatch):
    rowwise.kernel()  # this process's choice made first, so that undoing the patches below restores it
    monkeypatch.setattr(rowwise, "supported_variants", lambda: ("scalar",))
    monkeypatch.delenv("VERISPEC_KERNELS", raising=False)  # the suite also runs with VERISPEC_KERNELS=0
    monkeypatch.delenv("VERISPEC_KERNEL_VARIANT", raising=False)
    monkeypatch.delitem(rowwise._state, "module", raising=False)
    assert rowwise.kernel() is None  # MKL's products: faster than the plain C++ reference
    monkeypatch.setenv("VERISPEC_KERNEL_VARIANT", "scalar")
    monkeypatch.delitem(rowwise._state, "module")
    assert rowwise.kernel().variant() == "scalar"
