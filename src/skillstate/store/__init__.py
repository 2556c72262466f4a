"""Persistence behind one narrow interface, so backends (SQLite now, Redis later) are
interchangeable without touching the pipeline."""

from .base import SessionRecord, Store, StoreError, TransitionRecord

__all__ = ["SessionRecord", "Store", "StoreError", "TransitionRecord"]
