"""skillstate-proxy: keep long agent loops flat with an explicit JSON state."""

__version__ = "0.1.0"
