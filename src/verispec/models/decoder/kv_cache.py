"""KVCache: one sequence's preallocated key/value buffers, owned by that sequence.

Keys and values are written at explicit positions; `length` says how many positions are
valid, and only the cache's own verbs move it: `advance` after a forward has written its new
positions, `truncate` to roll back. Rolling back after a rejected draft is O(1): `truncate` only
moves `length` back, the stale entries are overwritten by the next write. A verified token tree
keeps its accepted path with `keep`, which moves the path's entries together. `capacity` is the most the sequence may hold;
the buffers start small and double on demand up to it, so a server can admit requests whose
max_tokens is large without reserving that memory up front. Sliding-window layers (Gemma 3) keep every
position too; the attention mask, not the cache, limits what they see, so truncation never
has to restore entries that slid out of a window.

Example (k = 3 drafts, 1 accepted):
    cache.length == 10                 # prompt and committed tokens
    model writes [last, d1, d2, d3]    # positions 10..13, then cache.advance(4): cache.length == 14
    cache.truncate(12)                 # keep last and d1; d2, d3 forgotten
"""

from __future__ import annotations

import torch


class KVCache:
    def __init__(
        self,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        capacity: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        allocated = min(capacity, self.INITIAL)
        shape = (num_layers, num_kv_heads, allocated, head_dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=device)  # [layers, kv_heads, allocated, head_dim]
        self.values = torch.zeros(shape, dtype=dtype, device=device)
        self.capacity = capacity
        self._length = 0

    INITIAL = 512  # positions allocated at first; doubled on demand up to capacity

    @property
    def length(self) -> int:
        """Positions 0..length-1 hold valid keys and values."""
        return self._length

    def reserve(self, end: int) -> None:
        """Make room for positions < end (doubling the buffers, never beyond capacity)."""
        if end > self.capacity:
            raise IndexError(f"KV cache overflow: writing up to {end} into capacity {self.capacity}")
        allocated = self.keys.shape[2]
        if end <= allocated:
            return
        size = min(self.capacity, max(end, 2 * allocated))
        grown_k = self.keys.new_zeros(*self.keys.shape[:2], size, self.keys.shape[3])
        grown_v = self.values.new_zeros(*self.values.shape[:2], size, self.values.shape[3])
        grown_k[:, :, : self.length] = self.keys[:, :, : self.length]
        grown_v[:, :, : self.length] = self.values[:, :, : self.length]
        self.keys, self.values = grown_k, grown_v

    def write(self, layer: int, start: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Store keys/values [kv_heads, T, head_dim] at positions start..start+T-1."""
        end = start + keys.shape[1]
        self.reserve(end)
        self.keys[layer, :, start:end] = keys
        self.values[layer, :, start:end] = values

    def view(self, layer: int, begin: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of positions begin..end-1: two [kv_heads, end-begin, head_dim] views."""
        return self.keys[layer, :, begin:end], self.values[layer, :, begin:end]

    def advance(self, n: int) -> None:
        """Count the next n positions (written by `write` or by the kernel into the reserved
        buffers) as valid: length += n."""
        end = self._length + n
        if n < 0 or end > self.keys.shape[2]:
            raise IndexError(f"cannot advance a cache of length {self._length} by {n} (room for {self.keys.shape[2]})")
        self._length = end

    def truncate(self, length: int) -> None:
        """Forget every position >= length. O(1)."""
        if not 0 <= length <= self._length:
            raise ValueError(f"cannot truncate a cache of length {self._length} to {length}")
        self._length = length

    def keep(self, start: int, indices: list[int]) -> None:
        """Keep one path of a verified token tree: the entries at slots start + indices[d] move to
        start + d, and length becomes start + len(indices). Indices must increase (a path lists
        ancestors before descendants), so no entry is overwritten before it moves.
        Example: a tree at slots 10..14, path [0, 2, 4] kept -> slots 10, 12, 14 become 10, 11, 12."""
        n = len(indices)
        if any(b <= a for a, b in zip(indices, indices[1:])) or (n and (indices[0] < 0 or start + indices[-1] >= self._length)):
            raise ValueError(f"cannot keep slots {start} + {list(indices)} of a cache of length {self._length}")
        if not 0 <= start <= self._length:
            raise ValueError(f"cannot keep a path from {start} in a cache of length {self._length}")
        if list(indices) != list(range(n)):  # a chain's prefix needs no move
            src = torch.tensor(indices, dtype=torch.int64, device=self.keys.device) + start
            with torch.inference_mode():  # buffers grown inside a forward are inference tensors
                self.keys[:, :, start : start + n] = self.keys[:, :, src]
                self.values[:, :, start : start + n] = self.values[:, :, src]
        self._length = start + n

    def nbytes(self) -> int:
        return self.keys.numel() * self.keys.element_size() * 2
