"""Streaming checkpoint surgery: revert, soup and interpolate safetensors checkpoints.

Importing this package does not import transformers: the engine needs only torch and the
safetensors file format, which it parses itself.
"""

__version__ = "0.1.0"
