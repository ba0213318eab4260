"""Eval wrapper: perplexity, multiple choice, translation chrF and the Copain probe.

`eval.api.evaluate(model, tokenizer, tasks)` scores a model held in memory; `surgery eval`
(eval/command.py) loads a checkpoint and calls it. Task strings are parsed in eval/tasks.py;
each task kind is one module of eval/kinds/.
"""
