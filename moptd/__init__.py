"""moptd: a node daemon and rule-based diagnostician for NVIDIA GPU inference hosts."""

__version__ = "0.1.0"
