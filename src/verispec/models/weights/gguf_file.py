"""A GGUF file's metadata and tensor table, read in one pass over a memory map.

gguf-py's `GGUFReader` builds several numpy views for every metadata value: over a large
vocabulary that takes seconds and hundreds of MiB, which count against the load's peak memory
(docs/design/quant.md, "Loading"). This reader decodes the values straight into Python objects (strings,
numbers, lists) and keeps the tensors as a table of (name, type, shape, offset, bytes); the
weights themselves stay in the file until a loader maps them.

Layout (little-endian, versions 2 and 3): magic "GGUF", u32 version, u64 tensor count,
u64 key/value count, the key/values (string key, u32 value type, value), the tensor infos
(string name, u32 dims, u64 per dim with the fastest-varying first, u32 ggml type, u64 offset
relative to the data section), then the data section, aligned to `general.alignment` (32 if
absent).
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from verispec.errors import UnsupportedModelError

__all__ = ["GGUFFile", "GGUFTensorInfo"]

_MAGIC = b"GGUF"
_VERSIONS = (2, 3)
_DEFAULT_ALIGNMENT = 32

# GGUF value types -> (struct format, numpy dtype) for the fixed-size ones.
_STRING, _ARRAY, _BOOL = 8, 9, 7
_SCALARS: dict[int, tuple[str, str]] = {
    0: ("<B", "<u1"), 1: ("<b", "<i1"), 2: ("<H", "<u2"), 3: ("<h", "<i2"),
    4: ("<I", "<u4"), 5: ("<i", "<i4"), 6: ("<f", "<f4"), 7: ("<?", "?"),
    10: ("<Q", "<u8"), 11: ("<q", "<i8"), 12: ("<d", "<f8"),
}


@dataclass(frozen=True)
class GGUFTensorInfo:
    name: str
    type: int  # ggml type id (gguf.GGMLQuantizationType)
    shape: tuple[int, ...]  # ggml order: the row width first
    offset: int  # absolute, in bytes from the start of the file
    n_bytes: int

    @property
    def n_rows(self) -> int:
        return int(np.prod(self.shape[1:])) if len(self.shape) > 1 else 1


class _Cursor:
    """Reads little-endian values from a buffer, with a clear error past its end."""

    def __init__(self, buf, path: Path) -> None:
        self.buf, self.pos, self.path = buf, 0, path

    def unpack(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.buf):
            raise UnsupportedModelError(f"{self.path} is not a readable GGUF file: it ends inside its metadata")
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return value

    def raw(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.buf):
            raise UnsupportedModelError(f"{self.path} is not a readable GGUF file: it ends inside its metadata")
        out = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        return out

    def string(self) -> str:
        # invalid UTF-8 (a byte-level vocabulary may hold some) is decoded leniently
        return self.raw(self.unpack("<Q")).decode("utf-8", errors="replace")

    def value(self, vtype: int) -> Any:
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            item, count = self.unpack("<I"), self.unpack("<Q")
            if item == _STRING:
                return [self.string() for _ in range(count)]
            if item in _SCALARS:
                dtype = np.dtype(_SCALARS[item][1])
                data = np.frombuffer(self.raw(count * dtype.itemsize), dtype=dtype)
                return data.tolist()
            return [self.value(item) for _ in range(count)]  # arrays of arrays
        if vtype in _SCALARS:
            return self.unpack(_SCALARS[vtype][0])
        raise UnsupportedModelError(f"{self.path} is not a readable GGUF file: unknown value type {vtype}")


class GGUFFile:
    """`metadata` (key -> str, int, float, bool or list) and `tensors` of one GGUF file."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        try:
            with open(self.path, "rb") as f:
                size = self.path.stat().st_size
                buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
        except OSError as e:
            raise UnsupportedModelError(f"{self.path} cannot be read: {e}") from e
        try:
            self._parse(buf, size)
        finally:
            if isinstance(buf, mmap.mmap):
                buf.close()

    def _parse(self, buf, size: int) -> None:
        c = _Cursor(buf, self.path)
        if bytes(buf[:4]) != _MAGIC:
            raise self._bad("no GGUF magic at its start")
        c.pos = 4
        self.version = c.unpack("<I")
        if self.version not in _VERSIONS:
            raise self._bad(f"GGUF version {self.version} (this reader takes versions 2 and 3, little-endian)")
        n_tensors, n_kv = c.unpack("<Q"), c.unpack("<Q")
        self.metadata: dict[str, Any] = {}
        for _ in range(n_kv):
            key = c.string()
            self.metadata[key] = c.value(c.unpack("<I"))
        infos = []
        for _ in range(n_tensors):
            name = c.string()
            shape = tuple(c.unpack("<Q") for _ in range(c.unpack("<I")))
            infos.append((name, shape, c.unpack("<I"), c.unpack("<Q")))
        alignment = int(self.metadata.get("general.alignment", _DEFAULT_ALIGNMENT))
        if alignment <= 0 or alignment & (alignment - 1):
            raise self._bad(f"its alignment {alignment} is not a power of two")
        self.data_start = -(-c.pos // alignment) * alignment
        self.tensors: list[GGUFTensorInfo] = []
        for name, shape, ggml_type, rel in infos:
            t = GGUFTensorInfo(name, ggml_type, shape, self.data_start + rel, _n_bytes(ggml_type, shape, self.path))
            if t.offset + t.n_bytes > size:
                raise self._bad(f"it is cut short: tensor {name} lies past its end")
            self.tensors.append(t)
        if len({t.name for t in self.tensors}) != len(self.tensors):
            raise self._bad("a tensor name repeats")

    def _bad(self, why: str) -> UnsupportedModelError:
        return UnsupportedModelError(f"{self.path} is not a readable GGUF file: {why}")

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    @property
    def architecture(self) -> str | None:
        return self.metadata.get("general.architecture")

    def tensor_data(self, t: GGUFTensorInfo, mapped: np.ndarray | None = None) -> np.ndarray:
        """The tensor as gguf-py lays it out: float types with numpy's shape (rows last in ggml
        order first), block types as uint8 rows of bytes. A view of `mapped` (the file as uint8)
        when given, else of a read-only map of the file."""
        if mapped is None:
            mapped = np.memmap(self.path, dtype=np.uint8, mode="r")
        raw = mapped[t.offset : t.offset + t.n_bytes]
        dims = tuple(reversed(t.shape))
        dtype = _FLOAT_TYPES.get(t.type)
        if dtype is not None:
            return raw.view(dtype).reshape(dims)
        return raw.reshape(*dims[:-1], -1)


_FLOAT_TYPES = {0: np.float32, 1: np.float16}


def _n_bytes(ggml_type: int, shape: tuple[int, ...], path: Path) -> int:
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        block, size = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
    except (KeyError, ValueError):
        raise UnsupportedModelError(f"{path}: GGUF tensor type {ggml_type} is not supported") from None
    n = int(np.prod(shape)) if shape else 1
    if shape and shape[0] % block:
        raise UnsupportedModelError(f"{path}: a row of {shape[0]} values is not whole blocks of {block}")
    return n // block * size
