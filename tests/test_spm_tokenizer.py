"""The compact SentencePiece tokenizer (models/spm_tokenizer.py) against the `tokenizers` pipeline
gguf_tokenizer builds from the same metadata (itself checked against transformers in
test_gguf_tokenizer.py): the same ids and the same text, on Gemma 3's real vocabulary and on
random vocabularies made to hit the corner cases (equal scores, repeated pieces, missing byte
tokens, added tokens inside words, whitespace pieces)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from verispec.models.tokenizers.gguf import compact_tokenizer_from_gguf, spm_from_gguf, tokenizer_from_gguf
from verispec.models.tokenizers.spm import SPIECE_SPACE, SpmTokenizer
from verispec.models.tokenizers.tokenizer import SPM_FILE, Tokenizer


def _gemma3_path() -> Path | None:
    from verispec.errors import ModelNotFoundError
    from verispec.models.weights.registry import resolve

    try:
        return resolve("gemma3-270m")
    except (ModelNotFoundError, ImportError):
        return None


def _random_texts(rng: random.Random, pieces: list[str], added: list[str], alphabet: list[str], n: int) -> list[str]:
    texts = []
    for _ in range(n):
        parts = []
        for _ in range(rng.randint(0, 24)):
            r = rng.random()
            if r < 0.45:
                parts.append(rng.choice(pieces).replace(SPIECE_SPACE, " "))
            elif r < 0.55 and added:
                parts.append(rng.choice(added))
            elif r < 0.65:
                parts.append(" " * rng.randint(1, 4))
            else:
                parts.append("".join(rng.choice(alphabet) for _ in range(rng.randint(1, 5))))
        texts.append("".join(parts))
    return texts


def _assert_same(ours: SpmTokenizer, ref, texts: list[str], rng: random.Random, n_ids: int) -> None:
    for text in texts:
        for special in (False, True):
            assert ours.encode(text, add_special_tokens=special).ids == ref.encode(text, add_special_tokens=special).ids, repr(text)
    size = ours.get_vocab_size()
    for _ in range(len(texts)):
        ids = [rng.randrange(size) for _ in range(rng.randint(0, 16))]
        for skip in (True, False):
            assert ours.decode(ids, skip) == ref.decode(ids, skip_special_tokens=skip), ids


def _synthetic_meta(seed: int, *, gemma: bool, missing_bytes: bool = False, scores: bool = True) -> dict:
    """A small random SentencePiece vocabulary: pieces over a tiny alphabet (so that words have
    many competing merges), scores with many ties, some pieces twice, whitespace pieces written
    with real spaces (Gemma's way), CONTROL / USER_DEFINED tokens, byte tokens (some missing)."""
    rng = random.Random(seed)
    letters = ["a", "b", "c", "é", SPIECE_SPACE]
    specials = ["<pad>", "<eos>", "<bos>", "<unk>", "<ctl>"]
    types = [3, 3, 3, 2, 3]
    tokens = list(specials)
    byte_range = [b for b in range(256) if not (missing_bytes and b in (0x21, 0xE2))]
    tokens += [f"<0x{b:02X}>" for b in byte_range]
    types += [6] * len(byte_range)
    normal = sorted({"".join(rng.choice(letters) for _ in range(rng.randint(1, 4))) for _ in range(160)})
    rng.shuffle(normal)  # (sorted first: a set's order changes with the process's string hashing)
    normal += [rng.choice(normal) for _ in range(6)]  # repeated pieces
    tokens += normal
    types += [1] * len(normal)
    user = ["<tag>", "\n", "\n\n", "ab!", "  ", "   "]  # "  ": a whitespace piece with real spaces
    tokens += user
    types += [4] * len(user)
    meta = {
        "general.architecture": "gemma3" if gemma else "llama",
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.bos_token_id": 2,
        "tokenizer.ggml.eos_token_id": 1,
        "tokenizer.ggml.unknown_token_id": 3,
        "tokenizer.ggml.padding_token_id": 0,
    }
    if scores:
        meta["tokenizer.ggml.scores"] = [0.0] * (len(tokens) - len(normal) - len(user)) + [
            float(rng.choice([-1, -2, -3, -4])) for _ in normal + user
        ]
    if gemma:
        meta["tokenizer.ggml.add_space_prefix"] = False
    return meta


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize(
    "gemma, missing_bytes, scores",
    [(False, False, True), (False, True, True), (True, False, True), (False, False, False), (True, True, True)],
)
def test_random_vocabularies_give_the_pipelines_ids_and_text(seed, gemma, missing_bytes, scores):
    meta = _synthetic_meta(seed, gemma=gemma, missing_bytes=missing_bytes, scores=scores)
    ours = spm_from_gguf(meta)
    assert isinstance(ours, SpmTokenizer)
    ref, _ = tokenizer_from_gguf(meta)
    rng = random.Random(seed + 100)
    alphabet = ["a", "b", "c", "é", " ", "!", "\n", "\u2192", "x", "😀", SPIECE_SPACE, "<", ">"]
    texts = ["", " ", "  a", "abc abc", "!!", "a!b", "<tag>a<tag>", "\n\na  b\n", "ab!ab", "<bos>a<eos>", " <ctl> x"]
    texts += _random_texts(rng, ours.pieces, list(ours.added), alphabet, 300)
    _assert_same(ours, ref, texts, rng, 300)
    assert ours.get_vocab() == ref.get_vocab(with_added_tokens=True)
    assert ours.get_vocab_size() == ref.get_vocab_size(with_added_tokens=True)
    for i in range(len(ours.pieces)):
        assert ours.id_to_token(i) == ref.id_to_token(i), i


def test_the_comparison_catches_a_wrong_merge_order():
    """Negative control: the same tokenizer with its ranks replaced by vocabulary order (Gemma's
    rule, wrong for a vocabulary ranked by scores), or with equal scores ordered by piece instead of
    by split (the left piece's length first), must give other ids on the same texts."""
    meta = _synthetic_meta(0, gemma=False)
    ours = spm_from_gguf(meta)
    ref, _ = tokenizer_from_gguf(meta)
    rng = random.Random(7)
    texts = _random_texts(rng, ours.pieces, list(ours.added), ["a", "b", "c", " "], 200)
    assert all(ours.encode(t).ids == ref.encode(t).ids for t in texts)
    scores = ours.neg_score
    ours.neg_score = None
    assert any(ours.encode(t).ids != ref.encode(t).ids for t in texts)
    ours.neg_score = [s - 1e-3 * ours.first[i] for i, s in enumerate(scores)]  # ties broken by piece
    assert any(ours.encode(t).ids != ref.encode(t).ids for t in texts)


def test_files_with_merges_keep_the_pipeline():
    meta = {**_synthetic_meta(0, gemma=False), "tokenizer.ggml.merges": ["a b"]}
    assert spm_from_gguf(meta) is None
    tok, _ = compact_tokenizer_from_gguf(meta)
    assert not isinstance(tok, SpmTokenizer)
    byte_level = {**meta, "tokenizer.ggml.model": "gpt2"}
    assert spm_from_gguf(byte_level) is None


def test_save_load_and_rebuilt_pipeline(tmp_path):
    meta = _synthetic_meta(1, gemma=True)
    ours = spm_from_gguf(meta)
    ours.save(tmp_path / "spm.json")
    again = SpmTokenizer.load(tmp_path / "spm.json")
    rebuilt_json = tokenizer_from_gguf(again.metadata())[0].to_str()  # the pipeline llguidance reads (Tokenizer.tokenizer_json)
    rebuilt = tokenizers_from_text(rebuilt_json)
    ref, _ = tokenizer_from_gguf(meta)
    rng = random.Random(3)
    texts = _random_texts(rng, ours.pieces, list(ours.added), ["a", "b", " ", "\n"], 100)
    for text in texts:
        assert again.encode(text).ids == ours.encode(text).ids == rebuilt.encode(text).ids == ref.encode(text).ids
    assert json.loads(rebuilt_json)["model"]["type"] == "BPE"
    with pytest.raises(ValueError, match="verispec-spm"):
        (tmp_path / "bad.json").write_text("{}")
        SpmTokenizer.load(tmp_path / "bad.json")


def tokenizers_from_text(text: str):
    from tokenizers import Tokenizer as HFTokenizer

    return HFTokenizer.from_str(text)


def test_the_wrapper_saves_and_loads_the_compact_form(tmp_path):
    meta = _synthetic_meta(2, gemma=False)
    tok = Tokenizer.from_gguf(meta)
    assert isinstance(tok.tok, SpmTokenizer)
    tok.save(tmp_path)
    assert (tmp_path / SPM_FILE).exists() and not (tmp_path / "tokenizer.json").exists()
    again = Tokenizer.load(tmp_path)
    assert isinstance(again.tok, SpmTokenizer)
    assert again.vocab_fingerprint() == tok.vocab_fingerprint()
    for text in ("abc <ctl> a", " b\n\nc", ""):
        assert again.encode(text) == tok.encode(text)
        assert again.encode(text)[:1] == [2]  # BOS, as the file's default for SentencePiece
        assert again.decode(again.encode(text)) == tok.decode(tok.encode(text))


@pytest.fixture(scope="module")
def gemma():
    path = _gemma3_path()
    if path is None:
        pytest.skip("Gemma 3 GGUF file is not installed")
    from verispec.models.weights.gguf_file import GGUFFile

    meta = GGUFFile(path).metadata
    ours, info = compact_tokenizer_from_gguf(meta)
    ref, ref_info = tokenizer_from_gguf(meta)
    return ours, info, ref, ref_info


def test_gemma3_gives_the_pipelines_ids_and_text(gemma):
    ours, info, ref, ref_info = gemma
    assert isinstance(ours, SpmTokenizer)
    assert info == ref_info
    rng = random.Random(0)
    alphabet = [chr(c) for c in [*range(32, 127), 9, 10, 13, 160, 0xE9, 0x4E2D, 0x1F600, 0x10348, 0x200D, 0x3000]]
    texts = [
        "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n",
        "def foo(x):\n    if x > 0:\n        return x * 2\n\treturn -1\n",
        "日本語のテキストと中文文本，한국어 텍스트 emoji 😀🎉👍🏽 👨\u200d👩\u200d👧 Gothic 𐍈",
        "<table><tr><td>cell</td></tr></table> [multimodal] <unused12><unused1>x<unused123",
    ]
    texts += _random_texts(rng, ours.pieces, list(ours.added), alphabet, 400)
    _assert_same(ours, ref, texts, rng, 400)
    assert ours.get_vocab_size() == ref.get_vocab_size(with_added_tokens=True)
    assert ours.get_vocab() == ref.get_vocab(with_added_tokens=True)
