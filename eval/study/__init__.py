"""The study: evaluation suites over languages and families (`surgery eval --suite`) and the
comparison of strategies against a base with paired bootstrap intervals (`surgery compare`)."""
