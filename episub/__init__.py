"""episub: proximity-aware epidemic pub/sub (HyParView + GoCast + Plumtree)."""

__version__ = "0.1.0"
