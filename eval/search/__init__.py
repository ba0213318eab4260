"""`surgery search`: interpolation profiles on the learning-forgetting frontier.

One strength per block of layers between BASE and TRAINED (`space`), objectives and budgets from
a suite (`objectives`), trials proposed by optuna and kept in its storage (`storage`), each
blended in memory and scored on the search half of the suite's items (`run`), the frontier
scored again on the report half with paired bootstrap intervals (`report`).
"""
