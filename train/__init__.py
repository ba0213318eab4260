"""Training wrapper: continual pretraining with layer-aware strategies on transformers Trainer.

Python API: `train.api.train(train.config.TrainConfig(...)) -> Path`; CLI: `surgery train`.
Strategies: layer freezing (`train.freezing`), L2-SP toward the base (`train.regularizers`),
weight averaging (`train.ema`), source mixing with a curriculum (`train.data`), LoRA
(`train.lora`); checkpoints are read and written in the base's own layout (`train.checkpoint_io`).
"""
