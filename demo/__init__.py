"""`surgery demo`: the paper's pipeline in miniature, offline."""
