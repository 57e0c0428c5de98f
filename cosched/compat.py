"""What differs between the Python versions cosched supports (3.10 and newer)."""
from __future__ import annotations

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser, published as tomli
    import tomli as tomllib

try:
    from importlib.resources.abc import Traversable
except ModuleNotFoundError:  # Python 3.10
    from importlib.abc import Traversable

__all__ = ["tomllib", "Traversable"]
