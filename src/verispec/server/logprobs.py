"""Logprobs in OpenAI's two shapes, from the engine's `TokenLogprob`s.

    completions: {"tokens": [...], "token_logprobs": [...], "top_logprobs": [{token: logprob}], "text_offset": [...]}
    chat:        {"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}]}

A token's string is its own bytes decoded as UTF-8; a token holding part of a character is
written "bytes:\\xe2\\x80" (vLLM's convention) and its exact bytes are in `bytes`. JSON has no
-inf: a token the processed distribution rules out gets -9999.0, as in vLLM.
"""

from __future__ import annotations

from verispec.engine.logprobs import TokenLogprob

FLOOR = -9999.0


class TokenStrings:
    """Each token's bytes and display string (llguidance's byte table where it reads the tokenizer)."""

    def __init__(self, tokenizer, grammars) -> None:
        self.tokenizer = tokenizer
        self.grammars = grammars
        self._cache: dict[int, bytes] = {}

    def bytes_of(self, token: int) -> bytes:
        if token not in self._cache:
            try:
                self._cache[token] = self.grammars.ll_tokenizer.decode_bytes([token])
            except Exception:  # a tokenizer llguidance does not read: the decoded text
                self._cache[token] = self.tokenizer.decode([token], skip_special_tokens=False).encode()
        return self._cache[token]

    def text(self, token: int) -> str:
        raw = self.bytes_of(token)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return "bytes:" + "".join(f"\\x{b:02x}" for b in raw)


def _value(logprob: float) -> float:
    return max(logprob, FLOOR)


def completion_logprobs(tokens: list[int], entries: list[TokenLogprob | None], strings: TokenStrings,
                        offset: int = 0) -> dict:
    """`entries[i]` for `tokens[i]` (None: the first prompt token, which has no logprob);
    `offset`: characters of text before the first token (text_offset counts from the choice's start)."""
    out: dict[str, list] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    done = b""  # the bytes of the tokens so far: a token's offset counts the whole characters before it
    for token, entry in zip(tokens, entries):
        out["tokens"].append(strings.text(token))
        out["text_offset"].append(offset + len(done.decode("utf-8", errors="ignore")))
        done += strings.bytes_of(token)
        if entry is None:
            out["token_logprobs"].append(None)
            out["top_logprobs"].append(None)
        else:
            out["token_logprobs"].append(_value(entry.logprob))
            out["top_logprobs"].append({strings.text(t): _value(v) for t, v in entry.top})
    return out


def chat_logprobs(entries: list[TokenLogprob], strings: TokenStrings) -> dict:
    def item(token: int, logprob: float) -> dict:
        return {"token": strings.text(token), "logprob": _value(logprob), "bytes": list(strings.bytes_of(token))}

    return {"content": [{**item(e.token_id, e.logprob), "top_logprobs": [item(t, v) for t, v in e.top]} for e in entries]}
