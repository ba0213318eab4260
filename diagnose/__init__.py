"""The commands that join surgery and eval: `sweep` and `localize` blend with surgery's
diagnostics and score with eval's scorers, and `train --eval-every` gets its scorer here too.

Above both (import-linter's layers in pyproject.toml): surgery and train never import eval, so
the scorers they take are built here and passed down.
"""
