"""stoker: keeps the GPUs of a large training job fed."""

__version__ = "0.1.0"
