"""Structured outputs on llguidance: a request's constraint compiled once, a matcher per request.

Why llguidance (not xgrammar): a 3 MB wheel with no dependencies (xgrammar's pulls in triton and
transformers), fast masks with no precomputation per grammar (docs/design/outputs.md), and
JSON schema, regex, choice and Lark grammars in one engine (GBNF is converted to Lark). Its
matcher validates a list of tokens, consumes and rolls back: what speculation needs.

    compiler = GrammarCompiler(tokenizer, vocab_size)          # one per engine
    matcher = compiler.matcher(StructuredOutputsParams(json=schema))
    n = matcher.valid_prefix(draft)      # cut a draft at the first token the grammar rejects
    allowed = matcher.mask()             # [vocab] bool, for the next position
    matcher.consume(tokens); matcher.rollback(k)

Once the grammar is complete (or the matcher stopped), only the end-of-sequence tokens are allowed.
JSON is compact (llguidance's whitespace_flexible off, as OpenAI's structured outputs): free
whitespace lets small models wander in newlines instead of writing the object.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from collections import OrderedDict

import numpy as np
import torch

from verispec.config import StructuredOutputsParams
from verispec.errors import InvalidGrammarError, UnsupportedModelError

CACHE_SIZE = 256


class GrammarCompiler:
    """Compiles constraints for one tokenizer; the llguidance tokenizer is built on first use (it
    takes seconds on a large vocabulary: docs/design/outputs.md) and shared."""

    def __init__(self, tokenizer, vocab_size: int) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self._ll = None
        self._lock = threading.Lock()
        self._compiled: OrderedDict[str, str] = OrderedDict()  # constraint -> grammar, most recent last

    @property
    def ll_tokenizer(self):
        with self._lock:
            if self._ll is None:
                from llguidance import LLTokenizer

                try:
                    self._ll = LLTokenizer(self.tokenizer.tokenizer_json(), n_vocab=self.vocab_size,
                                           eos_token=list(self.tokenizer.eos_token_ids))
                except ValueError as e:
                    raise UnsupportedModelError(
                        f"structured outputs need a tokenizer llguidance reads (byte-level BPE or SentencePiece): {e}") from e
            return self._ll

    def grammar(self, params: StructuredOutputsParams) -> str:
        """The llguidance grammar of a constraint; InvalidGrammarError (with llguidance's message)
        when it does not compile. The last CACHE_SIZE constraints are kept compiled."""
        key = json.dumps(dataclasses.asdict(params), sort_keys=True, default=str)
        with self._lock:
            if key in self._compiled:
                self._compiled.move_to_end(key)
                return self._compiled[key]
        grammar = self._compile(params)
        with self._lock:
            self._compiled[key] = grammar
            while len(self._compiled) > CACHE_SIZE:
                self._compiled.popitem(last=False)
        return grammar

    def _compile(self, params: StructuredOutputsParams) -> str:
        from llguidance import LLMatcher

        try:
            if params.json is not None or params.json_object:
                schema = {"type": "object"} if params.json_object else params.json
                if isinstance(schema, str):
                    schema = json.loads(schema)
                if not isinstance(schema, dict):
                    raise InvalidGrammarError(f"a JSON schema must be an object, got {type(schema).__name__}")
                grammar = LLMatcher.grammar_from_json_schema(schema, defaults={"whitespace_flexible": False})
            elif params.regex is not None:
                grammar = LLMatcher.grammar_from_regex(params.regex)
            elif params.choice is not None:
                options = " | ".join(json.dumps(c, ensure_ascii=False) for c in params.choice)
                grammar = LLMatcher.grammar_from_lark(f"start: {options}")
            else:
                from llguidance.gbnf_to_lark import any_to_lark

                grammar = LLMatcher.grammar_from_lark(any_to_lark(params.grammar))
        except InvalidGrammarError:
            raise
        except Exception as e:  # malformed JSON, a GBNF grammar the converter rejects
            raise InvalidGrammarError(f"invalid structured-output constraint: {e}") from e
        error = LLMatcher.validate_grammar(grammar, self.ll_tokenizer)
        if error and not error.startswith("WARNING"):
            raise InvalidGrammarError(f"invalid structured-output constraint: {error.strip()}")
        return grammar

    def matcher(self, params: StructuredOutputsParams) -> "GrammarMatcher":
        return GrammarMatcher(self, self.grammar(params))


class GrammarMatcher:
    """One request's position in its grammar."""

    def __init__(self, compiler: GrammarCompiler, grammar: str) -> None:
        from llguidance import LLMatcher

        self.vocab_size = compiler.vocab_size
        self.eos = list(compiler.tokenizer.eos_token_ids)
        self._m = LLMatcher(compiler.ll_tokenizer, grammar, log_level=0)
        if self._m.is_error():
            raise InvalidGrammarError(f"invalid structured-output constraint: {self._m.get_error()}")
        self._past_stop: list[int] = []  # tokens consumed after the matcher stopped (EOS only)

    def valid_prefix(self, tokens: list[int]) -> int:
        """How many leading tokens of `tokens` the grammar allows from here."""
        if not tokens or self._m.is_stopped():
            return 0
        return self._m.validate_tokens(list(tokens))

    def mask(self) -> torch.Tensor:  # [vocab] bool: the tokens allowed next
        if self._m.is_stopped():
            allowed = torch.zeros(self.vocab_size, dtype=torch.bool)
            allowed[self.eos] = True
            return allowed
        bits = np.unpackbits(np.frombuffer(self._m.compute_bitmask(), dtype=np.uint8), bitorder="little")
        allowed = torch.from_numpy(bits[: self.vocab_size].astype(bool))
        if not bool(allowed.any()):  # a matcher in error: end rather than sample from nothing
            allowed[self.eos] = True
        return allowed

    def consume(self, tokens: list[int]) -> None:
        """Advance through tokens the grammar allowed (drawn under its mask, or validated)."""
        for t in tokens:
            if self._m.is_stopped():
                self._past_stop.append(t)  # EOS repeated after the end (ignore_eos): nothing to parse
            elif not self._m.consume_token(t):
                error = self._m.get_error().strip().splitlines()
                raise RuntimeError(f"structured outputs: token {t} was not allowed: {error[-1] if error else ''}")

    def rollback(self, n: int) -> None:
        drop = min(n, len(self._past_stop))
        del self._past_stop[len(self._past_stop) - drop:]
        if n - drop:
            self._m.rollback(n - drop)
