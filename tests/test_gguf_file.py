"""verispec.models.weights.gguf_file against gguf-py's reader (the reference) on files the project writes,
and its errors on files that are cut short or not GGUF. (The bundled models' files are compared in
test_gguf_tokenizer.py, where gguf-py's reader is built once for transformers anyway.)"""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from verispec.errors import UnsupportedModelError
from verispec.models.weights.gguf_file import GGUFFile
from verispec.models.weights.loaders import gguf_dequantize
from verispec.models.weights.synth import SIZES, write


def _same_as_gguf_py(path) -> GGUFFile:
    ours, ref = GGUFFile(path), gguf.GGUFReader(str(path))
    keys = [k for k in ref.fields if not k.startswith("GGUF.")]
    assert list(ours.metadata) == keys
    for key in keys:
        want, got = ref.fields[key].contents(), ours.metadata[key]
        assert type(got) is type(want) and got == want, key
    assert [t.name for t in ours.tensors] == [t.name for t in ref.tensors]
    for t, r in zip(ours.tensors, ref.tensors):
        assert (t.type, t.shape, t.offset, t.n_bytes) == (
            int(r.tensor_type), tuple(int(x) for x in r.shape), int(r.data_offset), int(r.n_bytes)), t.name
        data = ours.tensor_data(t)
        assert data.dtype == r.data.dtype and data.shape == r.data.shape and np.array_equal(data, r.data), t.name
    return ours


@pytest.mark.parametrize("mix", ["q4_k_m", "q8_0", "q4_0", "q4_1", "q5_0"])
def test_synthetic_files_read_as_gguf_py_reads_them(tmp_path, mix):
    path = write(tmp_path / f"{mix}.gguf", SIZES["tiny"], mix, seed=3, progress=False)
    ours = _same_as_gguf_py(path)
    assert ours.architecture == "llama" and ours.version == 3
    norm = next(t for t in ours.tensors if t.name == "output_norm.weight")
    assert ours.tensor_data(norm).dtype == np.float32 and norm.n_rows == 1
    embed = next(t for t in ours.tensors if t.name == "token_embd.weight")
    assert embed.n_rows == SIZES["tiny"].vocab
    weights = gguf_dequantize(ours, embed)
    assert weights.shape == (SIZES["tiny"].vocab, SIZES["tiny"].hidden) and weights.dtype == np.float32
    assert np.isfinite(weights).all() and weights.std() > 0


def test_every_value_type_and_a_custom_alignment(tmp_path):
    """Scalars of each width, bools, strings (also not UTF-8), arrays of numbers, of strings and
    of arrays; a data section aligned to 64 bytes; float16 and float32 tensors."""
    path = tmp_path / "kinds.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_uint32("general.alignment", 64)
    w.add_uint8("t.u8", 250)
    w.add_int8("t.i8", -5)
    w.add_uint16("t.u16", 65000)
    w.add_int16("t.i16", -30000)
    w.add_uint32("t.u32", 4_000_000_000)
    w.add_int32("t.i32", -2_000_000_000)
    w.add_float32("t.f32", 0.1)
    w.add_uint64("t.u64", 2**63 + 5)
    w.add_int64("t.i64", -(2**62))
    w.add_float64("t.f64", 1e-300)
    w.add_bool("t.yes", True)
    w.add_bool("t.no", False)
    w.add_string("t.text", "héllo ▁ world\n")
    w.add_array("t.ints", [1, -2, 3])
    w.add_array("t.floats", [0.5, -1.25])
    w.add_array("t.words", ["a", "", "ü b"])
    w.add_array("t.empty", [])
    w.add_tensor("a", np.arange(12, dtype=np.float32).reshape(3, 4))
    w.add_tensor("b", np.arange(10, dtype=np.float16).reshape(2, 5))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    ours = _same_as_gguf_py(path)
    assert ours.get("t.f32") == pytest.approx(0.1) and ours.get("t.u64") == 2**63 + 5
    assert ours.get("t.text") == "héllo ▁ world\n" and ours.get("t.words") == ["a", "", "ü b"]
    assert ours.get("missing", 7) == 7
    assert ours.data_start % 64 == 0 and all(t.offset % 64 == 0 for t in ours.tensors)
    a, b = ours.tensors
    assert a.shape == (4, 3) and np.array_equal(ours.tensor_data(a), np.arange(12, dtype=np.float32).reshape(3, 4))
    assert ours.tensor_data(b).dtype == np.float16 and ours.tensor_data(b).shape == (2, 5)


def test_invalid_utf8_is_decoded_leniently(tmp_path):
    path = write(tmp_path / "m.gguf", SIZES["tiny"], "q8_0", seed=1, progress=False)
    raw = bytearray(path.read_bytes())
    at = raw.index(b"general.architecture") + len("general.architecture") + 4 + 8  # its value: "llama"
    assert raw[at : at + 5] == b"llama"
    raw[at + 4] = 0xFF  # "llam\xff": not UTF-8
    path.write_bytes(bytes(raw))
    assert GGUFFile(path).architecture == "llam\ufffd"


def test_files_that_are_not_gguf_or_cut_short(tmp_path):
    path = write(tmp_path / "m.gguf", SIZES["tiny"], "q4_0", seed=2, progress=False)
    raw = path.read_bytes()
    meta_end = GGUFFile(path).data_start
    cases = {
        "empty": b"",
        "text": b"not a gguf file at all",
        "in the header": raw[:10],
        "in the vocabulary": raw[: meta_end // 2],
        "in the tensor data": raw[: meta_end + (len(raw) - meta_end) // 2],
        "version 1": raw[:4] + (1).to_bytes(4, "little") + raw[8:],
        "big-endian": raw[:4] + (3).to_bytes(4, "big") + raw[8:],
    }
    expected = {
        "empty": "no GGUF magic", "text": "no GGUF magic", "in the header": "ends inside its metadata",
        "in the vocabulary": "ends inside its metadata", "in the tensor data": "lies past its end",
        "version 1": "GGUF version 1", "big-endian": "GGUF version 50331648",
    }
    for name, data in cases.items():
        bad = tmp_path / "bad.gguf"
        bad.write_bytes(data)
        with pytest.raises(UnsupportedModelError, match=f"not a readable GGUF file: .*{expected[name]}"):
            GGUFFile(bad)
    with pytest.raises(UnsupportedModelError, match="cannot be read"):
        GGUFFile(tmp_path / "missing.gguf")


def _mapping_rss_kib(path) -> int:
    """Resident KiB of this process's mappings of `path` (/proc/self/smaps)."""
    total, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            parts = line.split()
            if "-" in parts[0] and not parts[0].endswith(":"):
                inside = len(parts) > 5 and parts[5] == str(path)
            elif inside and parts[0] == "Rss:":
                total += int(parts[1])
    return total


@pytest.mark.skipif(not __import__("os").path.exists("/proc/self/smaps"), reason="needs Linux /proc")
def test_pages_read_into_a_copy_leave_the_process(tmp_path):
    """loaders._forget_pages: the whole pages of a range read once (q and k, copied to be permuted)
    no longer count in the process's memory; the bytes read back are still the file's."""
    import mmap

    from verispec.models.weights.loaders import _forget_pages

    path = tmp_path / "blob.bin"
    data = np.random.default_rng(0).integers(0, 256, 64 * mmap.PAGESIZE + 123, dtype=np.uint8)
    path.write_bytes(data.tobytes())
    mapped = np.memmap(path, dtype=np.uint8, mode="c")
    copy = np.array(mapped)  # reads (maps) every page
    assert (copy == data).all()
    before = _mapping_rss_kib(path)
    assert before >= 64 * mmap.PAGESIZE // 1024
    _forget_pages(mapped, 100, 60 * mmap.PAGESIZE)  # pages 1..59 wholly inside; 0 and 60 only in part
    after = _mapping_rss_kib(path)
    assert before - after == 59 * mmap.PAGESIZE // 1024
    assert (np.array(mapped) == data).all()
