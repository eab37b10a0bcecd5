"""drvenus: an edge-scale deep research agent toolkit (DR-Venus protocol)."""

__version__ = "0.1.0"
