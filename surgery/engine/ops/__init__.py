"""The operations: each module builds a `Plan` (surgery/engine/plan.py) from opened checkpoints;
the writer (surgery/engine/writer.py) does the rest. `surgery.api` runs them on user arguments."""
