"""Eval wrapper: perplexity, multiple choice, translation chrF and the Copain probe."""
