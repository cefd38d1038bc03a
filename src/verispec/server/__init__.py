"""The OpenAI-compatible HTTP server (`verispec serve`, or `create_app` to embed it)."""

from verispec.server.app import create_app

__all__ = ["create_app"]
