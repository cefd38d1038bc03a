"""Weight matrices kept as the GGUF file's blocks (Q4_0 ... Q6_K), unpacked only inside the
row-wise kernels' products (kernels/quant.h).

A `QuantTensor` stands where a float32 weight [out, in] would: the Transformer multiplies by it
through the kernel (`weight_mm`: each value bit for bit the float32 product over the dequantised
matrix, since the unpacking gives exactly gguf-py's float32 values), looks embedding rows up in it
(`take`), and unpacks it whole only for prompt processing (`dequantize`, into a fresh buffer that is
dropped after the layer). Its parts may differ in format: a fused q/k/v whose v is Q6_K beside
Q4_K q and k, as Q4_K_M files have.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from verispec.errors import UnsupportedModelError

# ggml's type numbers -> (name, weights per block, bytes per block)
FORMATS: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4),
    1: ("F16", 32, 64),
    2: ("Q4_0", 32, 18),
    3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24),
    8: ("Q8_0", 32, 34),
    12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176),
    14: ("Q6_K", 256, 210),
    30: ("BF16", 32, 64),
}
F32, F16, BF16 = 0, 1, 30  # the unquantised formats' numbers
_, Q8_0_VALUES, Q8_0_BYTES = FORMATS[8]  # a Q8_0 block: 32 values in 34 bytes
INT8 = 256  # added to a part's type in the kernels' Weight: products with int8 activations (kernels/quant8.h)
INT8_FORMATS = frozenset({2, 3, 6, 7, 8, 12, 13, 14})  # the block formats quant8.h multiplies that way (Int8<T>::kDefined; a test keeps them in step)
TILE_FORMATS = frozenset({2, 3, 6, 7, 8, 12, 14})  # of those, the ones with per-block float work and tiles of 16 rows (kernels/tile8.h, ktile8.h)
TILE_ROWS = 16


def row_bytes(type_: int, in_features: int) -> int:
    name, elems, nbytes = FORMATS[type_]
    if in_features % elems:
        raise UnsupportedModelError(f"{name} weights need rows of whole {elems}-weight blocks, got {in_features}")
    return in_features // elems * nbytes


class QuantTensor:
    """A weight matrix [out, in] stacked from parts, each float32 [rows, in] or GGUF blocks
    (uint8 [rows, row_bytes]) of one ggml type. Read-only: nothing here writes the blocks."""

    dtype = torch.float32  # what products with it compute in
    device = torch.device("cpu")

    def __init__(self, parts: list[torch.Tensor], types: list[int], in_features: int) -> None:
        if not parts or len(parts) != len(types):
            raise ValueError("QuantTensor: one type per part, at least one part")
        for p, t in zip(parts, types):
            if t not in FORMATS:
                raise UnsupportedModelError(f"GGUF tensor type {t} is not supported; supported: "
                                            f"{', '.join(name for name, _, _ in FORMATS.values())}")
            want = (torch.float32, in_features) if t == F32 else (torch.uint8, row_bytes(t, in_features))
            if p.dim() != 2 or (p.dtype, p.shape[1]) != want or not p.is_contiguous():
                raise ValueError(f"QuantTensor: a {FORMATS[t][0]} part must be contiguous {want[0]} [rows, {want[1]}], "
                                 f"got {p.dtype} {tuple(p.shape)}")
        self.parts = list(parts)
        self.types = [int(t) for t in types]
        self.shape = torch.Size((sum(p.shape[0] for p in parts), in_features))
        self.int8 = False  # products with int8 activations (weights_format "gguf-int8"), not exact float32

    @property
    def arg(self) -> tuple[list[torch.Tensor], list[int]]:
        """The kernels' Weight (kernels/rowwise.h): with `int8`, the block parts' types + INT8."""
        if self.int8:
            return self.parts, [t + INT8 if t in INT8_FORMATS else t for t in self.types]
        return self.parts, self.types

    @property
    def formats(self) -> list[str]:
        return [FORMATS[t][0] for t in self.types]

    @property
    def nbytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.parts)

    def numel(self) -> int:
        return self.shape[0] * self.shape[1]

    def element_size(self) -> float:
        return self.nbytes / self.numel()

    def is_contiguous(self) -> bool:
        return True

    def tile_int8(self, read: Callable[[int, int, int], None] | None = None, chunk_rows: int = 1024) -> None:
        """Switch to int8 activations and lay the 32-weight block parts (Q4_0, Q4_1, Q5_0, Q5_1,
        Q8_0) out as tiles of 16 rows (kernels/tile8.h: the same results as the file's rows,
        several times less float work a row). A part's last rows past a whole 16 stay a part of
        their own, as stored. Tiled chunk_rows rows at a time; read(p, start, end) is told after
        each chunk that bytes [start, end) of part p have been copied (the loader drops the file's
        pages of them, so that the file and its copy are never resident whole together)."""
        k = _kernel()
        if k is None:
            raise UnsupportedModelError("int8 activations need the row-wise kernels")
        chunk_rows = max(TILE_ROWS, chunk_rows // TILE_ROWS * TILE_ROWS)
        parts, types = [], []
        for i, (p, t) in enumerate(zip(self.parts, self.types)):
            whole = p.shape[0] // TILE_ROWS * TILE_ROWS if t in TILE_FORMATS and p.dim() == 2 else 0
            if whole:
                out = None
                for r0 in range(0, whole, chunk_rows):
                    r1 = min(whole, r0 + chunk_rows)
                    tiles = k.tile_weight(p[r0:r1], t)  # [(r1 - r0) / 16, blocks, tile block bytes]
                    if out is None:
                        out = torch.empty((whole // TILE_ROWS, *tiles.shape[1:]), dtype=torch.uint8)
                    out[r0 // TILE_ROWS : r1 // TILE_ROWS] = tiles
                    if read is not None:
                        read(i, r0 * p.shape[1], r1 * p.shape[1])
                parts.append(out)
                types.append(t)
            if whole < p.shape[0]:
                parts.append(p[whole:])
                types.append(t)
        self.parts, self.types, self.int8 = parts, types, True

    def first_rows(self, n: int) -> "QuantTensor":
        """The matrix's first n rows [n, in], sharing its blocks (views, nothing copied). Tiled parts
        are cut at whole tiles: n is rounded up to a multiple of TILE_ROWS within such a part.
        Example: parts of 1000 and 24 rows, n = 1010 -> the first part whole and 10 rows of the second."""
        parts, types, left = [], [], n
        for p, t in zip(self.parts, self.types):
            if left <= 0:
                break
            tiled = self.int8 and t in TILE_FORMATS and p.dim() == 3  # [rows / 16, blocks, tile bytes]
            rows = p.shape[0] * TILE_ROWS if tiled else p.shape[0]
            take = min(rows, -(-left // TILE_ROWS) * TILE_ROWS if tiled else left)
            parts.append(p[: take // TILE_ROWS] if tiled else p[:take])
            types.append(t)
            left -= take
        out = QuantTensor.__new__(QuantTensor)  # the parts are checked already (and tiles are 3-d)
        out.parts, out.types, out.int8 = parts, types, self.int8
        out.shape = torch.Size((n - left, self.shape[1]))
        return out

    @property
    def tiled(self) -> bool:
        """Every block part is int8 tiles (tile_int8): prompts take the kernel's products too."""
        return self.int8 and all(t in TILE_FORMATS for t in self.types)

    def dequantize(self) -> torch.Tensor:
        """The float32 matrix [out, in], each value exactly gguf-py's dequantisation."""
        k = _kernel()
        if k is not None:
            return k.dequantize(self.arg, self.shape[1])
        return torch.cat([_numpy_dequantize(p, t, self.shape[1]) for p, t in zip(self.parts, self.types)])

    def take(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows `ids` ([n] int64) of the float32 matrix: [n, in]."""
        k = _kernel()
        if k is not None:
            return k.take_rows(self.arg, self.shape[1], ids.to(torch.int64))
        return self.dequantize()[ids]

    def to(self, dtype: torch.dtype) -> torch.Tensor:
        return self.dequantize().to(dtype)

    def __repr__(self) -> str:
        return f"QuantTensor({tuple(self.shape)}, {'+'.join(self.formats)}, {self.nbytes / 2**20:.1f} MiB)"


def _kernel():
    from verispec.models.kernels import rowwise

    return rowwise.kernel()


def _numpy_dequantize(part: torch.Tensor, type_: int, in_features: int) -> torch.Tensor:
    if type_ == F32:
        return part
    import gguf

    out = gguf.quants.dequantize(part.numpy(), gguf.GGMLQuantizationType(type_))
    return torch.from_numpy(np.ascontiguousarray(out, dtype=np.float32).reshape(part.shape[0], in_features))


def use_int8(weights: dict) -> None:
    """Switch every QuantTensor among `weights` to int8 activations (tiles where tile8.h has them)."""
    for w in weights.values():
        if isinstance(w, QuantTensor) and not w.int8:
            w.tile_int8()


def weight_bytes(w) -> int:
    """Bytes a weight holds in memory: a tensor's, or a QuantTensor's blocks."""
    return w.nbytes if isinstance(w, QuantTensor) else w.numel() * w.element_size()
