"""Training wrapper: continual pretraining with layer-aware strategies on transformers Trainer.

Python API: `train.api.train(train.config.TrainConfig(...)) -> Path`; CLI: `surgery train`.
Strategies, one module each behind one protocol (`train.strategies`): layer freezing, L2-SP toward
the base, weight averaging (EMA), the English-mix curriculum, LoRA, early stopping, and the drift
log; the base is read and the result written in its own layout by the surgery engine's reader and
staged writer (`train.checkpoint_io` builds the plan).
"""
