"""Where things are: the checkout's root, for test modules at any depth under tests/."""

from __future__ import annotations

from pathlib import Path

# tests/paths.py -> tests/ -> the checkout.
ROOT = Path(__file__).resolve().parent.parent
