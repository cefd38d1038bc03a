"""Drafters. Importing this package registers the built-in ones."""

from verispec.proposers import draft_model, eagle, hybrid, prompt_lookup, suffix  # noqa: F401
from verispec.proposers.base import PROPOSERS, Budget, Draft, Proposer, SequenceView, create_proposer, register

__all__ = ["PROPOSERS", "Budget", "Draft", "Proposer", "SequenceView", "create_proposer", "register"]
