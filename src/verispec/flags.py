"""Command-line flags from the configuration dataclasses (verispec.config): one flag per field,
typed from its annotation, its help from the field's metadata, and the dataclass back from the
parsed flags. The CLI and the demo build their options here."""

from __future__ import annotations

import argparse
import dataclasses
import json
import typing
from typing import Any

_FLAG_NAMES = {"method": "method", "num_speculative_tokens": "k"}


def _base_type(tp: Any) -> Any:
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    return _base_type(args[0]) if args else tp


def add_dataclass_flags(parser: argparse.ArgumentParser, cls: type, skip: tuple[str, ...] = ()) -> None:
    """One flag per dataclass field: --field-name, typed from the annotation, help from metadata."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name in skip or "help" not in f.metadata:
            continue
        flag = "--" + _FLAG_NAMES.get(f.name, f.name).replace("_", "-")
        tp = _base_type(hints[f.name])
        default = f.default if f.default is not dataclasses.MISSING else None
        if tp is bool:
            parser.add_argument(
                flag, dest=f.name, action=argparse.BooleanOptionalAction, default=None,
                help=f"{f.metadata['help']} (default: {'on' if default else 'off'})",
            )
        elif typing.get_origin(tp) is dict or dataclasses.is_dataclass(tp):
            parser.add_argument(flag, dest=f.name, type=_json_arg, default=None, help=f"{f.metadata['help']} (JSON)")
        elif typing.get_origin(tp) is list:
            item = typing.get_args(tp)[0]
            parser.add_argument(flag, dest=f.name, type=item, action="append", default=None, help=f.metadata["help"])
        else:
            parser.add_argument(flag, dest=f.name, type=tp, default=default, help=f"{f.metadata['help']} (default: {default})")


def _json_arg(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not JSON: {e}") from e


def from_args(cls: type, args: argparse.Namespace, **extra: Any):
    names = {f.name for f in dataclasses.fields(cls)}
    values = {k: v for k, v in vars(args).items() if k in names and v is not None}
    return cls(**{**values, **extra})
