"""A `tokenizers.Tokenizer` built from the tokenizer metadata inside a GGUF file.

A GGUF carries no `tokenizer.json`; llama.cpp stores the vocabulary, merges, token types and
special ids as metadata under `tokenizer.ggml.*`. This module rebuilds the equivalent Hugging Face
(Rust `tokenizers`) pipeline from them, without importing transformers:

* `tokenizer.ggml.model == "gpt2"`: byte-level BPE. The merges come from the file; the split
  regex is chosen from `tokenizer.ggml.pre` (the llama.cpp pre-tokenizer name).
* `tokenizer.ggml.model == "llama"`: SentencePiece-style BPE with byte fallback (`<0xNN>`
  tokens). SentencePiece files carry no merges, so they are derived from the vocabulary: every
  split of a token into two pieces that are both in the vocabulary is a merge, ranked by the
  merged token's score (for Gemma: by its position in the vocabulary, see `_spm_tokenizer`).

Token types follow llama.cpp / transformers: CONTROL tokens become special added tokens, and
USER_DEFINED ones become plain (non-special) added tokens matched whole in the raw text. Both are
`normalized=False`, so the text must contain them literally.

The engine loads `compact_tokenizer_from_gguf`: for a SentencePiece vocabulary without merges it
is `spm.SpmTokenizer`, which gives this pipeline's ids without holding the derived
merges; otherwise this pipeline.

The result matches `transformers.AutoTokenizer.from_pretrained(folder, gguf_file=...)` on the
files we test (SmolLM2, Gemma 3), except where noted in `_BYTE_LEVEL_PRE` (transformers ignores
`tokenizer.ggml.pre` values it does not know, e.g. "smollm"; we follow llama.cpp and the model's
original `tokenizer.json` there).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from operator import itemgetter
from collections.abc import Mapping
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

from verispec.errors import UnsupportedModelError
from verispec.models.tokenizers.spm import (CONTROL, NORMAL, SPIECE_SPACE, UNKNOWN, USER_DEFINED, SpmTokenizer,
                                           gemma_spelling)

logger = logging.getLogger(__name__)

__all__ = [
    "GGUFTokenizerInfo",
    "tokenizer_from_gguf",
    "compact_tokenizer_from_gguf",
    "spm_from_gguf",
    "tokenizer_info",
    "SUPPORTED_TOKENIZER_MODELS",
]

SUPPORTED_TOKENIZER_MODELS = ("gpt2", "llama")

# Tokens that end a turn / the text, by their text (llama.cpp's end-of-generation list).
_END_OF_TURN_TEXTS = (
    "<|im_end|>",
    "<end_of_turn>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<EOT>",
    "_<EOT>",
    "<end_of_utterance>",
)


@dataclass(frozen=True)
class GGUFTokenizerInfo:
    bos_token_id: int | None
    eos_token_id: int | None
    add_bos_token: bool  # tokenizer.ggml.add_bos_token; default per model type when absent
    chat_template: str | None  # tokenizer.chat_template, None if absent
    eos_token_ids: tuple[int, ...]  # eos first, then other end-of-turn tokens present in the vocab


# ---------------------------------------------------------------------------------------------
# Reading metadata


def _token_id(meta: Mapping[str, Any], key: str, n_tokens: int) -> int | None:
    value = meta.get(key)
    if value is None:
        return None
    value = int(value)
    if not 0 <= value < n_tokens:
        logger.warning("GGUF %s = %d is outside the vocabulary (%d tokens); ignoring it", key, value, n_tokens)
        return None
    return value


# ---------------------------------------------------------------------------------------------
# Byte-level BPE ("gpt2")


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

_QWEN35_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

_TEKKEN_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

_GPT4O_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


@dataclass(frozen=True)
class _PreSpec:
    kind: str  # "gpt2": ByteLevel's own GPT-2 regex; "digits+gpt2": digits split first; "regex": `split`
    split: str | None = None
    ignore_merges: bool = False  # llama.cpp: a pre-token that is a whole vocab entry is used as is
    add_bos: bool = False  # llama.cpp's default when tokenizer.ggml.add_bos_token is absent


_GPT2 = _PreSpec("gpt2")
_DIGITS_GPT2 = _PreSpec("digits+gpt2")
_LLAMA3 = _PreSpec("regex", _LLAMA3_SPLIT, ignore_merges=True, add_bos=True)

# tokenizer.ggml.pre -> how to pre-tokenize (names and settings from llama.cpp's llama-vocab.cpp).
_BYTE_LEVEL_PRE: dict[str, _PreSpec] = {
    # GPT-2's regex (ByteLevel's built-in). "default" is what older converters wrote.
    **dict.fromkeys(
        ("default", "gpt2", "gpt-2", "phi-2", "mpt", "olmo", "jais", "trillion", "granite-docling", "exaone4",
         "roberta-bpe", "jina-v1-en", "jina-v2-code", "jina-es", "jina-de", "jina-v2-es", "jina-v2-de", "mellum",
         "gigachat", "a.x-4.0"),
        _GPT2,
    ),
    # Each digit (any \p{N} character) on its own, then GPT-2's regex: SmolLM's tokenizer.json
    # (Digits + ByteLevel) and llama.cpp. transformers' GGUF loader does not know "smollm" and uses
    # plain ByteLevel; the two differ only where whitespace precedes a numeric character: "a  1"
    # gives "a","ĠĠ","1" here (as the original) but "a","Ġ","Ġ","1" there; " ½" gives "Ġ","½".
    **dict.fromkeys(
        ("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b"), _DIGITS_GPT2
    ),
    # Llama 3 family (ignore_merges as in its tokenizer.json and llama.cpp).
    **dict.fromkeys(
        ("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2", "jina-v5-nano"),
        _LLAMA3,
    ),
    "dbrx": _PreSpec("regex", _LLAMA3_SPLIT),
    "smaug-bpe": _PreSpec("regex", _LLAMA3_SPLIT),
    **dict.fromkeys(
        ("qwen2", "deepseek-r1-qwen", "kormo", "megrez", "stablelm2", "hunyuan", "grok-2"),
        _PreSpec("regex", _QWEN2_SPLIT),
    ),
    "qwen35": _PreSpec("regex", _QWEN35_SPLIT),
    "tekken": _PreSpec("regex", _TEKKEN_SPLIT, ignore_merges=True, add_bos=True),
    **dict.fromkeys(("gpt-4o", "llama4", "minimax-m2"), _PreSpec("regex", _GPT4O_SPLIT)),
}


def _byte_level_pre_tokenizer(spec: _PreSpec) -> pre_tokenizers.PreTokenizer:
    if spec.kind == "gpt2":
        return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if spec.kind == "digits+gpt2":
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
            ]
        )
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(spec.split), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )


def _byte_level_tokenizer(
    meta: Mapping[str, Any], tokens: list[str], token_types: list[int]
) -> tuple[Tokenizer, list[AddedToken], list[str], bool]:
    """(tokenizer without added tokens, added tokens, vocab spelling, default add_bos)."""
    spelling = _bytes_to_unicode()
    alphabet = frozenset(spelling.values())
    # Every real token is written in the byte alphabet already; respell any that is not (which
    # is how transformers treats them) so the vocabulary stays consistent.
    spelled = [
        t if alphabet.issuperset(t) else "".join(spelling[b] for b in t.encode("utf-8")) for t in tokens
    ]
    vocab = {t: i for i, t in enumerate(spelled)}

    raw_merges = meta.get("tokenizer.ggml.merges")
    if raw_merges is not None:
        merges = []
        for m in raw_merges:
            left, sep, right = m.partition(" ")
            if not sep:
                raise UnsupportedModelError(f"GGUF tokenizer merge {m!r} is not of the form 'left right'")
            merges.append((left, right))
    else:
        logger.info("GGUF byte-level tokenizer has no merges; deriving them from the vocabulary")
        merges = _derive_merges(vocab, None)

    pre_name = meta.get("tokenizer.ggml.pre") or "default"
    spec = _BYTE_LEVEL_PRE.get(pre_name)
    if spec is None:
        logger.warning(
            "GGUF pre-tokenizer %r is not known; falling back to GPT-2's split regex (tokenization may differ "
            "slightly from the original model)",
            pre_name,
        )
        spec = _GPT2

    tok = Tokenizer(
        models.BPE(
            vocab=vocab,
            merges=merges,
            dropout=None,
            continuing_subword_prefix="",
            end_of_word_suffix="",
            fuse_unk=False,
            byte_fallback=False,
            ignore_merges=spec.ignore_merges,
        )
    )
    tok.normalizer = None
    tok.pre_tokenizer = _byte_level_pre_tokenizer(spec)
    tok.decoder = decoders.ByteLevel()

    added: list[AddedToken] = []
    for token, ttype in zip(tokens, token_types):
        if ttype == CONTROL:
            # A control token outside the byte alphabet is a converter mislabel (transformers skips it too).
            if alphabet.issuperset(token):
                added.append(AddedToken(token, special=True, normalized=False))
        elif ttype == USER_DEFINED and token in vocab:
            added.append(AddedToken(token, special=False, normalized=False))
    return tok, added, spelled, spec.add_bos


# ---------------------------------------------------------------------------------------------
# SentencePiece-style BPE ("llama")


def _derive_merges(vocab: dict[str, int], scores: dict[str, float] | None) -> list[tuple[str, str]]:
    """BPE merges implied by a vocabulary (same order as transformers' `generate_merges`).

    Every split of a token into two in-vocabulary pieces is a merge. With `scores`, merges are
    ranked by the merged token's score, highest first (ties: longer left piece, then longer right
    piece first); without, by the merged token's id, lowest first (ties: shorter pieces first).
    Equal keys keep vocabulary order.
    """
    descending = scores is not None
    ranking = scores if descending else vocab
    found: list[tuple[float, int, int, str, str]] = []
    append = found.append
    for token, rank in ranking.items():
        n = len(token)
        for k in range(1, n):
            left = token[:k]
            if left in vocab:
                right = token[k:]
                if right in vocab:
                    append((rank, k, n - k, left, right))
    found.sort(key=itemgetter(0, 1, 2), reverse=descending)
    return [(left, right) for _, _, _, left, right in found]


def _spm_tokenizer(
    meta: Mapping[str, Any], tokens: list[str], token_types: list[int], unk_id: int | None
) -> tuple[Tokenizer, list[AddedToken], list[str], bool]:
    arch = str(meta.get("general.architecture") or "")
    gemma = arch.startswith("gemma")
    scores = meta.get("tokenizer.ggml.scores")  # length checked in _check_metadata

    spelled = tokens
    if gemma:
        spelled = [gemma_spelling(t) for t in tokens]
    vocab = {t: i for i, t in enumerate(spelled)}

    raw_merges = meta.get("tokenizer.ggml.merges")
    if raw_merges is not None:
        merges = [tuple(m.split(" ", 1)) for m in raw_merges]
    elif gemma or scores is None:
        # Gemma's scores do not follow its merge order; its vocabulary order does.
        merges = _derive_merges(vocab, {t: -i for i, t in enumerate(spelled)})
    else:
        merges = _derive_merges(vocab, dict(zip(spelled, scores)))

    if unk_id is not None:
        unk_token: str | None = spelled[unk_id]
    else:
        unk_token = "<unk>" if "<unk>" in vocab else None

    tok = Tokenizer(
        models.BPE(
            vocab=vocab, merges=merges, dropout=None, unk_token=unk_token, fuse_unk=True, byte_fallback=True
        )
    )
    # llama.cpp defaults add_space_prefix to true for SentencePiece vocabularies.
    add_space_prefix = meta.get("tokenizer.ggml.add_space_prefix")
    add_space_prefix = True if add_space_prefix is None else bool(add_space_prefix)
    decode_steps = [decoders.Replace(SPIECE_SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    if add_space_prefix:
        # "▁" before the start of the text only, as transformers' LlamaTokenizer (legacy=False);
        # llama.cpp also prefixes the text right after each special token. (Gemma: no prefix.)
        tok.normalizer = None
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SPIECE_SPACE, prepend_scheme="first", split=False)
        decode_steps.append(decoders.Strip(content=" ", left=1, right=0))
    else:
        tok.normalizer = normalizers.Replace(" ", SPIECE_SPACE)
        tok.pre_tokenizer = None
    tok.decoder = decoders.Sequence(decode_steps)

    added: list[AddedToken] = []
    for token, ttype in zip(tokens, token_types):
        if ttype in (CONTROL, UNKNOWN):
            added.append(AddedToken(token, special=True, normalized=False))
        elif ttype == USER_DEFINED and token in vocab:
            # Whitespace pieces respelled above are no longer in the vocabulary under their raw
            # spelling and are left to the merges (as transformers does).
            added.append(AddedToken(token, special=False, normalized=False))
    return tok, added, spelled, True


# ---------------------------------------------------------------------------------------------
# Public entry point


def _template_piece(token: str, fallback: str) -> str:
    # TemplateProcessing parses "<name>:<type_id>"; a token containing ':' or whitespace would not
    # parse, so it is referred to by a placeholder name (the encoding still gets the real token).
    return token if token and ":" not in token and not any(c.isspace() for c in token) else fallback


def _post_processor(
    bos: tuple[str, int] | None, eos: tuple[str, int] | None
) -> processors.TemplateProcessing:
    specials = []
    pre: list[str] = []
    post: list[str] = []
    if bos is not None:
        name = _template_piece(bos[0], "BOS")
        specials.append({"id": name, "ids": [bos[1]], "tokens": [bos[0]]})
        pre.append(name)
    if eos is not None:
        name = _template_piece(eos[0], "EOS")
        if not specials or specials[0]["id"] != name:
            specials.append({"id": name, "ids": [eos[1]], "tokens": [eos[0]]})
        post.append(name)
    single = [f"{p}:0" for p in pre] + ["$A:0"] + [f"{p}:0" for p in post]
    pair = single + [f"{p}:1" for p in pre] + ["$B:1"] + [f"{p}:1" for p in post]
    return processors.TemplateProcessing(single=single, pair=pair, special_tokens=specials)


def _check_metadata(meta: Mapping[str, Any]) -> tuple[str, list[str], list[int]]:
    """(tokenizer model, tokens, token types), or UnsupportedModelError."""
    model_type = meta.get("tokenizer.ggml.model")
    if model_type is None:
        raise UnsupportedModelError("GGUF file has no tokenizer (no tokenizer.ggml.model key)")
    model_type = str(model_type)
    if model_type not in SUPPORTED_TOKENIZER_MODELS:
        raise UnsupportedModelError(
            f"GGUF tokenizer model {model_type!r} is not supported; supported: "
            "'gpt2' (byte-level BPE) and 'llama' (SentencePiece BPE)"
        )
    tokens = meta.get("tokenizer.ggml.tokens")
    if not tokens:
        raise UnsupportedModelError("GGUF file has no tokenizer vocabulary (tokenizer.ggml.tokens)")
    n = len(tokens)
    token_types = meta.get("tokenizer.ggml.token_type")
    if token_types is None:
        token_types = [NORMAL] * n
    elif len(token_types) != n:
        raise UnsupportedModelError(f"GGUF tokenizer has {len(token_types)} token types for {n} tokens")
    scores = meta.get("tokenizer.ggml.scores")
    if model_type == "llama" and scores is not None and len(scores) != n:
        raise UnsupportedModelError(f"GGUF tokenizer has {len(scores)} scores for {n} tokens")
    return model_type, tokens, token_types


def tokenizer_info(meta: Mapping[str, Any], vocab: Mapping[str, int], default_add_bos: bool) -> GGUFTokenizerInfo:
    """BOS / EOS / end-of-turn ids, the BOS rule and the chat template, from the metadata and the
    vocabulary (text -> id) the tokenizer built from it."""
    n = len(meta["tokenizer.ggml.tokens"])
    bos_id = _token_id(meta, "tokenizer.ggml.bos_token_id", n)
    eos_id = _token_id(meta, "tokenizer.ggml.eos_token_id", n)
    add_bos = meta.get("tokenizer.ggml.add_bos_token")
    add_bos = default_add_bos if add_bos is None else bool(add_bos)
    eos_ids: list[int] = [] if eos_id is None else [eos_id]
    extra = {
        i
        for i in (
            _token_id(meta, "tokenizer.ggml.eot_token_id", n),
            _token_id(meta, "tokenizer.ggml.eom_token_id", n),
        )
        if i is not None
    }
    for text in _END_OF_TURN_TEXTS:
        i = vocab.get(text)
        if i is not None:
            extra.add(i)
    eos_ids.extend(sorted(extra - set(eos_ids)))
    chat_template = meta.get("tokenizer.chat_template")
    return GGUFTokenizerInfo(
        bos_token_id=bos_id,
        eos_token_id=eos_id,
        add_bos_token=add_bos,
        chat_template=str(chat_template) if chat_template is not None else None,
        eos_token_ids=tuple(eos_ids),
    )


def tokenizer_from_gguf(meta: Mapping[str, Any]) -> tuple[Tokenizer, GGUFTokenizerInfo]:
    """Build the model's tokenizer from a GGUF file's metadata (`GGUFFile.metadata`: key -> value).

    The returned tokenizer's post-processor adds BOS (and EOS) as the file asks
    (`tokenizer.ggml.add_bos_token` / `add_eos_token`), as transformers' tokenizer does; use
    `add_special_tokens=False` for the text's ids alone.

    Raises UnsupportedModelError for a tokenizer type other than "gpt2" / "llama", or for
    missing / inconsistent tokenizer metadata.
    """
    model_type, tokens, token_types = _check_metadata(meta)
    n = len(tokens)
    bos_id = _token_id(meta, "tokenizer.ggml.bos_token_id", n)
    eos_id = _token_id(meta, "tokenizer.ggml.eos_token_id", n)
    unk_id = _token_id(meta, "tokenizer.ggml.unknown_token_id", n)
    pad_id = _token_id(meta, "tokenizer.ggml.padding_token_id", n)

    if model_type == "gpt2":
        tok, added, spelled, default_add_bos = _byte_level_tokenizer(meta, tokens, token_types)
    else:
        tok, added, spelled, default_add_bos = _spm_tokenizer(meta, tokens, token_types, unk_id)

    # bos/eos/unk/pad are special whatever type the file gives them (transformers adds them as
    # its special tokens); most files already mark them CONTROL.
    seen = {t.content for t in added if t.special}
    for i in (bos_id, eos_id, unk_id, pad_id):
        if i is not None and spelled[i] not in seen:
            added.append(AddedToken(spelled[i], special=True, normalized=False))
            seen.add(spelled[i])
    special = [t for t in added if t.special]
    plain = [t for t in added if not t.special]
    if special:
        tok.add_special_tokens(special)
    if plain:
        tok.add_tokens(plain)

    info = tokenizer_info(meta, tok.get_vocab(with_added_tokens=False), default_add_bos)
    add_eos = bool(meta.get("tokenizer.ggml.add_eos_token") or False)
    tok.post_processor = _post_processor(
        (spelled[bos_id], bos_id) if info.add_bos_token and bos_id is not None else None,
        (spelled[eos_id], eos_id) if add_eos and eos_id is not None else None,
    )
    return tok, info


def spm_from_gguf(meta: Mapping[str, Any]) -> SpmTokenizer | None:
    """The compact tokenizer (`spm.SpmTokenizer`) for a GGUF "llama" vocabulary, or None where it
    would not give this module's pipeline's ids (a byte-level vocabulary, explicit merges in the
    file, an added token whose text is not in the vocabulary): the caller then builds the pipeline.
    Raises UnsupportedModelError as `tokenizer_from_gguf` does."""
    model_type, tokens, token_types = _check_metadata(meta)
    if model_type != "llama" or meta.get("tokenizer.ggml.merges") is not None:
        return None
    n = len(tokens)
    add_space_prefix = meta.get("tokenizer.ggml.add_space_prefix")
    add_bos = meta.get("tokenizer.ggml.add_bos_token")  # SentencePiece's default: BOS (_spm_tokenizer)
    try:
        return SpmTokenizer(
            tokens,
            token_types,
            meta.get("tokenizer.ggml.scores"),
            gemma=str(meta.get("general.architecture") or "").startswith("gemma"),
            add_space_prefix=True if add_space_prefix is None else bool(add_space_prefix),
            unk_id=_token_id(meta, "tokenizer.ggml.unknown_token_id", n),
            pad=_token_id(meta, "tokenizer.ggml.padding_token_id", n),
            bos=_token_id(meta, "tokenizer.ggml.bos_token_id", n),
            eos=_token_id(meta, "tokenizer.ggml.eos_token_id", n),
            add_bos=True if add_bos is None else bool(add_bos),
            add_eos=bool(meta.get("tokenizer.ggml.add_eos_token") or False),
        )
    except ValueError as e:
        logger.info("GGUF SentencePiece vocabulary kept as a tokenizers pipeline: %s", e)
        return None


def compact_tokenizer_from_gguf(meta: Mapping[str, Any]) -> tuple[Tokenizer | SpmTokenizer, GGUFTokenizerInfo]:
    """(tokenizer, info) with the compact SentencePiece tokenizer (`spm_from_gguf`) where it gives
    the same ids as `tokenizer_from_gguf`'s pipeline (a "llama" vocabulary without merges: Gemma,
    Llama 2, ...), else that pipeline. The compact one holds no merges and derives none, so it
    takes less than half the memory and builds faster (docs/design/quant.md)."""
    compact = spm_from_gguf(meta)
    if compact is None:
        return tokenizer_from_gguf(meta)
    return compact, tokenizer_info(meta, compact.vocab, compact.add_bos)
