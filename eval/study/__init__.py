"""The study layer of eval: suites over languages and families, their results, comparisons.

`suite` parses a suite file, `runner` scores one model on it (`surgery eval MODEL --suite`),
`results` reads and writes the results folder every comparison reads.
"""
