"""Tokenizer: a `tokenizers.Tokenizer` plus what generation needs (BOS rule, end tokens, chat template)."""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jinja2
import jinja2.sandbox
import tokenizers

from verispec.errors import ChatTemplateError
from verispec.models.heap import return_freed_heap
from verispec.models.tokenizers.spm import SpmTokenizer

SPM_FILE = "spm.json"  # a compact SentencePiece tokenizer's file (models/tokenizers/spm.py)

log = logging.getLogger("verispec")

# Gemma's turn format, used only for Gemma models whose file carries no template (the bundled
# Gemma 3 270M is the base model). Said loudly in a warning when used.
GEMMA_FALLBACK_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{% if role == 'system' %}{{ '<start_of_turn>user\n' + message['content'] + '\n\n' }}"
    "{% else %}{% if not (loop.index0 > 0 and messages[loop.index0 - 1]['role'] == 'system') %}"
    "{{ '<start_of_turn>' + role + '\n' }}{% endif %}"
    "{{ message['content'] + '<end_of_turn>\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)


LONG_TEXT = 16384  # characters


_JSON_STRING = r'"(?:[^"\\]|\\.)*"'
_MERGE_PAIR = re.compile(rf"\[({_JSON_STRING}),({_JSON_STRING})\]")


def _with_string_merges(text: str) -> str:
    """A tokenizer.json with its BPE merges written as "left right" strings instead of pairs,
    where no piece holds a space: the same tokenizer, which `tokenizers` parses faster. Rewritten
    in the text, not through json: parsing a large file into Python objects takes several times
    its size in memory."""
    at = text.find('"merges":[')
    if at < 0:
        return text
    start = pos = at + len('"merges":[')
    merges = []
    while (m := _MERGE_PAIR.match(text, pos)) is not None:
        left, right = m.group(1), m.group(2)
        if " " in left or " " in right:
            return text
        merges.append(f"{left[:-1]} {right[1:]}")
        pos = m.end() + (text.startswith(",", m.end()))
    if not merges or not text.startswith("]", pos):  # not pairs (already strings, or another layout)
        return text
    return text[:start] + ",".join(merges) + text[pos:]


def _raise_exception(message: str):
    raise ChatTemplateError(f"chat template rejected the messages: {message}")


_TEMPLATE_ENV = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
_TEMPLATE_ENV.globals["raise_exception"] = _raise_exception
_TEMPLATE_ENV.filters["tojson"] = lambda v, indent=None: json.dumps(v, indent=indent, ensure_ascii=False)


@functools.lru_cache(maxsize=16)
def _compiled(template: str) -> jinja2.Template:
    """A chat template compiled once (~5 ms each time otherwise: a request's whole tokenisation is less)."""
    return _TEMPLATE_ENV.from_string(template)


class Tokenizer:
    def __init__(
        self,
        tok: tokenizers.Tokenizer | SpmTokenizer,
        bos_token_id: int | None,
        eos_token_ids: tuple[int, ...],
        add_bos: bool,
        chat_template: str | None,
        use_post_processor: bool = False,
        fallback_template: str | None = None,
    ) -> None:
        self.tok = tok
        self.bos_token_id = bos_token_id
        self.eos_token_ids = tuple(eos_token_ids)
        self.add_bos = add_bos
        self.chat_template = chat_template
        self.fallback_template = fallback_template
        self.use_post_processor = use_post_processor  # HF folders: tokenizer.json adds BOS itself
        self.vocab_size = tok.get_vocab_size(with_added_tokens=True)
        self._warned_fallback = False
        self._fingerprint: str | None = None

    def vocab_fingerprint(self) -> str:
        """SHA-256 of the vocabulary (every token with its id, in id order): two tokenizers with
        the same fingerprint map every token to the same id."""
        if self._fingerprint is None:
            pairs = sorted(self.tok.get_vocab(with_added_tokens=True).items(), key=lambda kv: kv[1])
            self._fingerprint = hashlib.sha256(json.dumps(pairs, ensure_ascii=False).encode()).hexdigest()
        return self._fingerprint

    # -- construction -------------------------------------------------------------------------
    @classmethod
    def from_gguf(cls, meta: Mapping[str, Any]) -> "Tokenizer":
        """From a GGUF file's metadata (`GGUFFile.metadata`)."""
        from verispec.models.tokenizers.gguf import compact_tokenizer_from_gguf

        tok, info = compact_tokenizer_from_gguf(meta)
        arch = str(meta.get("general.architecture") or "")
        return_freed_heap()
        return cls(
            tok,
            info.bos_token_id,
            info.eos_token_ids,
            info.add_bos_token,
            info.chat_template,
            fallback_template=GEMMA_FALLBACK_TEMPLATE if arch.startswith("gemma") else None,
        )

    @classmethod
    def from_hf_folder(cls, path: Path) -> "Tokenizer":
        tok_file = path / "tokenizer.json"
        if not tok_file.exists():
            from verispec.errors import ModelNotFoundError

            raise ModelNotFoundError(f"{path} has no tokenizer.json")
        tok = tokenizers.Tokenizer.from_file(str(tok_file))
        return_freed_heap()
        cfg: dict[str, Any] = {}
        if (path / "tokenizer_config.json").exists():
            cfg = json.loads((path / "tokenizer_config.json").read_text())
        template = cfg.get("chat_template")
        if (path / "chat_template.jinja").exists():
            template = (path / "chat_template.jinja").read_text()
        if isinstance(template, list):  # named templates: take the default one
            template = next((t["template"] for t in template if t.get("name") == "default"), None)

        def token_id(value) -> int | None:
            if isinstance(value, dict):
                value = value.get("content")
            return tok.token_to_id(value) if value else None

        eos = [token_id(cfg.get("eos_token"))]
        gen_cfg = path / "generation_config.json"
        if gen_cfg.exists():
            raw = json.loads(gen_cfg.read_text()).get("eos_token_id")
            eos += raw if isinstance(raw, list) else [raw]
        eos_ids = tuple(dict.fromkeys(int(e) for e in eos if e is not None))
        return cls(tok, token_id(cfg.get("bos_token")), eos_ids, False, template, use_post_processor=True)

    def tokenizer_json(self) -> str:
        """The tokenizer as `tokenizers`' tokenizer.json text (for libraries that read one, such as
        llguidance). A SentencePiece vocabulary's equivalent pipeline is built on demand, with the
        derived merges: seconds and a large vocabulary's full memory."""
        if isinstance(self.tok, SpmTokenizer):
            from verispec.models.tokenizers.gguf import tokenizer_from_gguf

            return tokenizer_from_gguf(self.tok.metadata())[0].to_str()
        return self.tok.to_str()

    def save(self, folder: Path) -> None:
        if isinstance(self.tok, SpmTokenizer):
            self.tok.save(folder / SPM_FILE)
        else:
            (folder / "tokenizer.json").write_text(_with_string_merges(self.tok.to_str()), encoding="utf-8")
        meta = dict(
            bos_token_id=self.bos_token_id,
            eos_token_ids=list(self.eos_token_ids),
            add_bos=self.add_bos,
            chat_template=self.chat_template,
            use_post_processor=self.use_post_processor,
            fallback_template=self.fallback_template,
        )
        (folder / "tokenizer_meta.json").write_text(json.dumps(meta))

    @classmethod
    def load(cls, folder: Path) -> "Tokenizer":
        """A tokenizer saved by `save`: the compact SentencePiece one where `save` wrote it, else a
        `tokenizers` pipeline."""
        meta = json.loads((folder / "tokenizer_meta.json").read_text())
        meta["eos_token_ids"] = tuple(meta["eos_token_ids"])
        tok: tokenizers.Tokenizer | SpmTokenizer
        if (folder / SPM_FILE).exists():
            tok = SpmTokenizer.load(folder / SPM_FILE)
        else:
            tok = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
        return_freed_heap()
        return cls(tok, **meta)

    # -- use ----------------------------------------------------------------------------------
    def _encode(self, text: str, add_special_tokens: bool):
        # a long text through encode_batch, which releases the GIL while it works (encode holds it):
        # a server tokenising a large prompt on a worker thread keeps answering meanwhile. (The
        # compact SentencePiece tokenizer is Python and holds it: ~1 us a character.)
        if len(text) > LONG_TEXT:
            return self.tok.encode_batch([text], add_special_tokens=add_special_tokens)[0]
        return self.tok.encode(text, add_special_tokens=add_special_tokens)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if self.use_post_processor:
            return self._encode(text, add_special_tokens).ids
        ids = self._encode(text, False).ids
        if add_special_tokens and self.add_bos and self.bos_token_id is not None:
            if not ids or ids[0] != self.bos_token_id:
                ids = [self.bos_token_id, *ids]
        return ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        template = self.chat_template
        if template is None:
            if self.fallback_template is None:
                raise ChatTemplateError(
                    "this model carries no chat template; use generate() with a plain prompt instead"
                )
            if not self._warned_fallback:
                log.warning("model has no chat template; using the Gemma turn format as a fallback")
                self._warned_fallback = True
            template = self.fallback_template
        bos = self.tok.id_to_token(self.bos_token_id) if self.bos_token_id is not None else ""
        eos = self.tok.id_to_token(self.eos_token_ids[0]) if self.eos_token_ids else ""
        try:
            return _compiled(template).render(
                messages=messages, add_generation_prompt=add_generation_prompt, bos_token=bos, eos_token=eos
            )
        except jinja2.TemplateError as e:
            raise ChatTemplateError(f"chat template failed: {e}") from e

    def encode_chat(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> list[int]:
        # Templates write BOS themselves when they want it; never add a second one.
        text = self.apply_chat_template(messages, add_generation_prompt)
        return self.encode(text, add_special_tokens=False)
