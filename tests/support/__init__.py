"""Helpers shared by the tests: tiny real-architecture checkpoints, output checks, references."""
