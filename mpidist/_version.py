"""mpidist's version, in a leaf module so that any layer (``python -m mpidist info``) can read it."""

__version__ = "0.1.0"
