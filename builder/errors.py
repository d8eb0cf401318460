"""Errors of the builder: every one carries a message fit to show a user as is."""
from __future__ import annotations


class BuildError(ValueError):
    """Bad input or an impossible build (bad token ids, empty corpus, tokenizer mismatch on append)."""


class EmptyCorpusError(BuildError):
    """Nothing to index: no document had a token."""
