"""A compact SentencePiece-BPE tokenizer for GGUF "llama" vocabularies (Gemma 3, Llama 2, ...).

`tokenizers.gguf` rebuilds these vocabularies as a Hugging Face `tokenizers` BPE, with merges
derived from the vocabulary (every split of a token into two tokens of the vocabulary, ranked by
the merged token). That is exact, but Gemma 3's 262,144 tokens become ~515k merges, held beside
two hash maps of the vocabulary's strings: as much memory as a third of the model's weights
(docs/design/quant.md). SentencePiece itself needs no merges: two neighbouring pieces merge when
their concatenation is in the vocabulary, the best-ranked concatenation first. This class does
exactly that, with the same ranks, tie-breaks and edge cases as the `tokenizers` pipeline
`tokenizers.gguf` builds, so its ids are the same (tests/test_spm_tokenizer.py checks it against
that pipeline on the real files and on random text), and it holds the vocabulary once.

The pipeline it reproduces, in order:
1. Added tokens (CONTROL, UNKNOWN, USER_DEFINED, and BOS / EOS / UNK / PAD) are cut out of the
   raw text first, leftmost match first, the longest at that position.
2. The rest: spaces become "▁" (and, with `add_space_prefix`, one "▁" before the text when the
   piece begins the text), then BPE over the whole piece: one symbol per character (a character
   not in the vocabulary becomes its UTF-8 bytes' `<0xNN>` tokens, or `<unk>`), then repeatedly
   the pair of neighbours whose concatenation ranks best is merged (the order of the derived
   merges: see `__init__`; the leftmost pair among equals).
3. Decoding: "▁" back to spaces, runs of `<0xNN>` tokens to their UTF-8 text (U+FFFD per byte
   where invalid), joined; with `add_space_prefix`, one leading space removed.
"""

from __future__ import annotations

import heapq
import json
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SPIECE_SPACE = "\u2581"  # "▁"

# gguf.TokenType values, spelled out so neither this module nor tokenizers/gguf.py needs gguf
NORMAL, UNKNOWN, CONTROL, USER_DEFINED = 1, 2, 3, 4


def gemma_spelling(token: str) -> str:
    """Gemma writes its whitespace-only pieces ("  ", "   ", ...) with real spaces while the text
    is looked up with "▁": such a piece respelled so merges can reach it; any other as it is."""
    return SPIECE_SPACE * len(token) if " " in token and not token.strip() else token

FORMAT = "verispec-spm-1"


@dataclass(frozen=True)
class Encoding:
    """What `encode` returns (the part of `tokenizers.Encoding` the engine reads)."""

    ids: list[int]


class SpmTokenizer:
    """SentencePiece BPE over a GGUF vocabulary; the methods the engine calls on a
    `tokenizers.Tokenizer`, with the same results (see the module's docstring)."""

    def __init__(
        self,
        tokens: Sequence[str],
        token_types: Sequence[int],
        scores: Sequence[float] | None,
        *,
        gemma: bool,
        add_space_prefix: bool,
        unk_id: int | None,
        pad: int | None = None,
        bos: int | None = None,
        eos: int | None = None,
        add_bos: bool = False,
        add_eos: bool = False,
    ) -> None:
        n = len(tokens)
        if len(token_types) != n or (scores is not None and len(scores) != n):
            raise ValueError("tokens, token types and scores differ in length")
        self.gemma, self.add_space_prefix = gemma, add_space_prefix
        # Gemma's whitespace pieces respelled, as tokenizers/gguf.py's pipeline does; the originals are
        # kept for `metadata`
        pieces = [gemma_spelling(t) for t in tokens] if gemma else list(tokens)
        self.respelled = {i: t for i, (t, p) in enumerate(zip(tokens, pieces)) if p != t}
        self.pieces = pieces
        self.vocab: dict[str, int] = {t: i for i, t in enumerate(pieces)}  # a repeated piece: its last id
        self.types = array("b", token_types)
        self.scores = None if scores is None else array("f", scores)
        # Which merge comes first, as `tokenizers` orders tokenizers/gguf.py's derived merges: by the
        # merged piece's id (Gemma, whose scores do not follow its merge order, and vocabularies
        # without scores), then the longer left piece; or, with scores, by the merged piece's score
        # (highest first), then the longer left piece, then the longer right piece, then the piece's
        # first place in the vocabulary (a stable sort over pieces with equal keys).
        self.neg_score: list[float] | None = None
        self.first: list[int] | None = None
        if scores is not None and not gemma:
            self.neg_score = [-float(x) for x in scores]  # a repeated piece: its last score (its id's)
            first = {}
            for i, t in enumerate(pieces):
                first.setdefault(t, i)
            self.first = [first[t] for t in pieces]
        self.unk_id = unk_id
        self.unk_piece = None if unk_id is None else pieces[unk_id]
        if self.unk_piece is None and "<unk>" in self.vocab:
            self.unk_piece = "<unk>"
        self.byte_ids = [self.vocab.get(f"<0x{b:02X}>") for b in range(256)]

        # Added tokens, matched whole in the raw text: CONTROL and UNKNOWN ones (special), then
        # USER_DEFINED ones still in the vocabulary under their own spelling, then BOS/EOS/UNK/PAD.
        special: dict[str, int] = {}
        plain: dict[str, int] = {}
        for i, (t, ty) in enumerate(zip(tokens, token_types)):
            if ty in (CONTROL, UNKNOWN):
                special.setdefault(t, i)
            elif ty == USER_DEFINED and t in self.vocab:
                plain.setdefault(t, i)
        for i in (bos, eos, unk_id, pad):  # special whatever their type, as in tokenizers/gguf.py
            if i is not None:
                special.setdefault(pieces[i], i)
        self.special = frozenset(special)
        contents = [*special, *(t for t in plain if t not in special)]
        # an added token's id is the vocabulary's id of its text
        self.added: dict[str, int] = {}
        for t in contents:
            if t not in self.vocab:
                raise ValueError(f"added token {t!r} is not in the vocabulary under that spelling")
            self.added[t] = self.vocab[t]
        lengths: dict[str, set[int]] = {}
        for t in self.added:
            if t:
                lengths.setdefault(t[0], set()).add(len(t))
        self._added_lengths = {c: sorted(ls, reverse=True) for c, ls in lengths.items()}
        self.bos, self.eos, self.pad, self.add_bos, self.add_eos = bos, eos, pad, add_bos, add_eos

    # -- the engine's calls --------------------------------------------------------------------
    def encode(self, text: str, add_special_tokens: bool = True) -> Encoding:
        ids: list[int] = []
        for piece, is_added, at_start in self._split_added(text):
            if is_added:
                ids.append(self.added[piece])
            else:
                ids.extend(self._bpe(self._normalise(piece, at_start)))
        if add_special_tokens:
            if self.add_bos and self.bos is not None:
                ids.insert(0, self.bos)
            if self.add_eos and self.eos is not None:
                ids.append(self.eos)
        return Encoding(ids)

    def encode_batch(self, texts: Sequence[str], add_special_tokens: bool = True) -> list[Encoding]:
        return [self.encode(t, add_special_tokens) for t in texts]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        out: list[str] = []
        pending = bytearray()
        for i in ids:
            t = self.id_to_token(int(i))
            if t is None or (skip_special_tokens and t in self.special):
                continue
            t = t.replace(SPIECE_SPACE, " ")
            if len(t) == 6 and t.startswith("<0x") and t.endswith(">") and _is_hex2(t[3:5]):
                pending.append(int(t[3:5], 16))
                continue
            if pending:
                out.append(_bytes_text(pending))
                pending.clear()
            out.append(t)
        if pending:
            out.append(_bytes_text(pending))
        text = "".join(out)
        if self.add_space_prefix and text.startswith(" "):
            text = text[1:]
        return text

    def id_to_token(self, i: int) -> str | None:
        if not 0 <= i < len(self.pieces):
            return None
        t = self.pieces[i]
        return t if self.vocab[t] == i else None  # a repeated piece answers to its last id only

    def token_to_id(self, token: str) -> int | None:
        return self.vocab.get(token)

    def get_vocab(self, with_added_tokens: bool = True) -> dict[str, int]:
        return dict(self.vocab)

    def get_vocab_size(self, with_added_tokens: bool = True) -> int:
        return len(self.vocab)

    # -- the pipeline --------------------------------------------------------------------------
    def _split_added(self, text: str):
        """(piece, is an added token, piece starts the text), added tokens leftmost-longest."""
        lengths = self._added_lengths
        added = self.added
        start = i = 0
        n = len(text)
        while i < n:
            ls = lengths.get(text[i])
            if ls is not None:
                for length in ls:
                    cand = text[i : i + length]
                    if len(cand) == length and cand in added:
                        if i > start:
                            yield text[start:i], False, start == 0
                        yield cand, True, False
                        i += length
                        start = i
                        break
                else:
                    i += 1
                continue
            i += 1
        if start < n:
            yield text[start:], False, start == 0

    def _normalise(self, piece: str, at_start: bool) -> str:
        piece = piece.replace(" ", SPIECE_SPACE)
        if self.add_space_prefix and at_start and not piece.startswith(SPIECE_SPACE):
            piece = SPIECE_SPACE + piece
        return piece

    def _bpe(self, word: str) -> list[int]:
        vocab = self.vocab
        syms: list[str] = []
        ids: list[int] = []
        unk: int | None = None  # a run of unknown characters waiting to be written (fused)
        for ch in word:
            i = vocab.get(ch)
            if i is not None:
                if unk is not None:
                    syms.append(self.unk_piece)
                    ids.append(unk)
                    unk = None
                syms.append(ch)
                ids.append(i)
                continue
            byte_ids = [self.byte_ids[b] for b in ch.encode("utf-8")]
            if all(b is not None for b in byte_ids):
                # (a pending unknown run is written after these bytes, as `tokenizers` does)
                for b in byte_ids:
                    syms.append(self.pieces[b])
                    ids.append(b)
                continue
            if self.unk_piece is None:
                raise ValueError(f"character {ch!r} is not in the vocabulary and there is no <unk>")
            if unk is None:
                unk = vocab[self.unk_piece]
        if unk is not None:
            syms.append(self.unk_piece)
            ids.append(unk)
        n = len(syms)
        if n < 2:
            return ids

        neg_score, first = self.neg_score, self.first
        if neg_score is None:

            def entry(left: str, merged: int, right: str, p: int) -> tuple:
                return (merged, -len(left), p, merged)

        else:

            def entry(left: str, merged: int, right: str, p: int) -> tuple:
                return (neg_score[merged], -len(left), -len(right), first[merged], p, merged)

        prev = list(range(-1, n - 1))
        nxt = list(range(1, n + 1))
        nxt[-1] = -1
        alive = [True] * n
        heap = []
        for p in range(n - 1):
            j = vocab.get(syms[p] + syms[p + 1])
            if j is not None:
                heap.append(entry(syms[p], j, syms[p + 1], p))
        heapq.heapify(heap)
        push, pop = heapq.heappush, heapq.heappop
        while heap:
            top = pop(heap)
            p, j = top[-2], top[-1]
            q = nxt[p]
            if not alive[p] or q < 0:
                continue
            merged = syms[p] + syms[q]
            if vocab.get(merged) != j:  # the pair changed since this entry was pushed
                continue
            syms[p], ids[p] = merged, j
            alive[q] = False
            r = nxt[q]
            nxt[p] = r
            if r >= 0:
                prev[r] = p
            a = prev[p]
            if a >= 0:
                k = vocab.get(syms[a] + merged)
                if k is not None:
                    push(heap, entry(syms[a], k, merged, a))
            if r >= 0:
                k = vocab.get(merged + syms[r])
                if k is not None:
                    push(heap, entry(merged, k, syms[r], p))
        return [ids[p] for p in range(n) if alive[p]]

    # -- storage -------------------------------------------------------------------------------
    def metadata(self) -> dict[str, Any]:
        """The GGUF tokenizer metadata this tokenizer was built from (enough to rebuild it, or
        the `tokenizers` pipeline)."""
        meta: dict[str, Any] = {
            "general.architecture": "gemma3" if self.gemma else "llama",
            "tokenizer.ggml.model": "llama",
            "tokenizer.ggml.tokens": self._tokens(),
            "tokenizer.ggml.token_type": list(self.types),
            "tokenizer.ggml.add_space_prefix": self.add_space_prefix,
            "tokenizer.ggml.add_bos_token": self.add_bos,
            "tokenizer.ggml.add_eos_token": self.add_eos,
        }
        if self.scores is not None:
            meta["tokenizer.ggml.scores"] = list(self.scores)
        for key, value in (("bos", self.bos), ("eos", self.eos), ("unknown", self.unk_id), ("padding", self.pad)):
            if value is not None:
                meta[f"tokenizer.ggml.{key}_token_id"] = value
        return meta

    def _tokens(self) -> list[str]:
        """The vocabulary as the file wrote it (Gemma's whitespace pieces with their spaces)."""
        return [self.respelled.get(i, t) for i, t in enumerate(self.pieces)]

    def save(self, path: Path) -> None:
        state = {
            "format": FORMAT,
            "tokens": self._tokens(),
            "token_types": list(self.types),
            "scores": None if self.scores is None else list(self.scores),
            "gemma": self.gemma,
            "add_space_prefix": self.add_space_prefix,
            "unk_id": self.unk_id,
            "pad": self.pad,
            "bos": self.bos,
            "eos": self.eos,
            "add_bos": self.add_bos,
            "add_eos": self.add_eos,
        }
        path.write_text(json.dumps(state, ensure_ascii=False), encoding="utf-8")

    @classmethod
    def load(cls, path: Path) -> "SpmTokenizer":
        state = json.loads(path.read_text(encoding="utf-8"))
        if state.pop("format", None) != FORMAT:
            raise ValueError(f"{path} is not a {FORMAT} file")
        return cls(state.pop("tokens"), state.pop("token_types"), state.pop("scores"), **state)


def _is_hex2(s: str) -> bool:
    return all(c in "0123456789abcdefABCDEF" for c in s)


def _bytes_text(data: bytearray) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return "\ufffd" * len(data)

