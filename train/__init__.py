"""Training wrapper: continual pretraining with layer-aware strategies on transformers Trainer."""
