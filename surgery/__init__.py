"""Streaming checkpoint surgery: revert, soup and interpolate safetensors checkpoints.

Importing this package does not import transformers: the engine parses the safetensors format
itself, and imports torch only to blend (byte copies, inspect and verify never need it).
"""

__version__ = "0.1.0"
