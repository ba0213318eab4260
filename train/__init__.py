"""Training wrapper: continual pretraining with layer-aware strategies on transformers Trainer.

Python API: `train.api.train(train.config.TrainConfig(...)) -> Path`; CLI: `surgery train`.
Strategies: layer freezing (`train.freezing`), L2-SP toward the base (`train.regularizers`),
weight averaging (`train.ema`), source mixing with a curriculum (`train.data`), LoRA
(`train.lora`); the base is read and the result written in its own layout by the surgery
engine's reader and staged writer (`train.checkpoint_io` builds the plan).
"""
