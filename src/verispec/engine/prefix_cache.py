"""Prefix caching: keys and values of token blocks earlier requests computed, reused by later
requests that start with the same tokens (a system prompt, the earlier turns of a chat).

A block is BLOCK consecutive tokens at a block-aligned position; it is stored under its parent
block and its own tokens, so a match is exact token for token (no hash to collide). Blocks leave
least recently used first once `max_bytes` is passed; a block whose parent left can no longer be
reached and ages out in turn.

Exactness: reused keys and values must be the ones the request would have computed itself. The
engine therefore prefills prompts through the decoding kernels (rows computed one by one with the
arithmetic of a one-token decode, `RunnerCapabilities.prefill_rows`) whenever prefix caching is
on, so a position's keys and values do not depend on how the prompt was split, on whether they
came from a prompt or from decoding, or on what else ran in the batch.

    cache = PrefixCache(runner, max_bytes=2**30)
    n = cache.reuse(seq, prompt)    # the longest cached block prefix written into seq (< len(prompt))
    ...                             # prefill prompt[n:], decode
    cache.remember(seq, tokens)     # tokens whose keys and values seq holds: their full blocks kept
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch

BLOCK = 16  # tokens per block


@dataclass
class _Block:
    id: int
    keys: torch.Tensor  # [layers, kv_heads, BLOCK, head_dim]
    values: torch.Tensor

    @property
    def nbytes(self) -> int:
        return 2 * self.keys.numel() * self.keys.element_size()


class PrefixCache:
    def __init__(self, runner, max_bytes: int) -> None:
        self.runner = runner
        self.max_bytes = max_bytes
        self._blocks: OrderedDict[tuple[int, tuple[int, ...]], _Block] = OrderedDict()  # (parent id, tokens)
        self._next_id = 1  # 0 is the root
        self.bytes = 0
        self.queried_tokens = 0  # prompt tokens looked up (vLLM's prefix_cache_queries)
        self.hit_tokens = 0  # of which reused (prefix_cache_hits)

    def reuse(self, seq: int, tokens: list[int]) -> int:
        """Write the longest cached prefix of tokens[:-1] (whole blocks) into the empty sequence
        `seq`; returns its length. The last token is always left to forward (its logits are needed)."""
        self.queried_tokens += len(tokens)
        parent, reused = 0, 0
        while reused + BLOCK <= len(tokens) - 1:
            key = (parent, tuple(tokens[reused : reused + BLOCK]))
            block = self._blocks.get(key)
            if block is None:
                break
            self._blocks.move_to_end(key)
            self.runner.write_kv(seq, block.keys, block.values)
            parent, reused = block.id, reused + BLOCK
        self.hit_tokens += reused
        return reused

    def remember(self, seq: int, tokens: list[int]) -> None:
        """Keep the full blocks of `tokens`, whose keys and values `seq` holds at positions 0.."""
        tokens = tokens[: self.runner.length(seq)]
        parent = 0
        for start in range(0, len(tokens) - BLOCK + 1, BLOCK):
            key = (parent, tuple(tokens[start : start + BLOCK]))
            block = self._blocks.get(key)
            if block is None:
                keys, values = self.runner.read_kv(seq, start, start + BLOCK)
                block = self._blocks[key] = _Block(self._next_id, keys, values)
                self._next_id += 1
                self.bytes += block.nbytes
            else:
                self._blocks.move_to_end(key)
            parent = block.id
        self._evict()

    def _evict(self) -> None:
        while self.bytes > self.max_bytes and self._blocks:
            _, block = self._blocks.popitem(last=False)
            self.bytes -= block.nbytes

    @property
    def num_blocks(self) -> int:
        return len(self._blocks)
