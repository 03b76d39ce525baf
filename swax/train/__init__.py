"""Training: config tree, window and lr schedules, the loop, checkpoints, distributed setup."""

from swax.train.config import (
    CheckpointConfig,
    DistConfig,
    LogConfig,
    OptimConfig,
    TrainConfig,
    WindowConfig,
    load_train_config,
)
from swax.train.schedules import FixedWindow, StochasticWindow, lr_at
from swax.train.trainer import TrainingError, train

__all__ = [
    "CheckpointConfig",
    "DistConfig",
    "FixedWindow",
    "LogConfig",
    "OptimConfig",
    "StochasticWindow",
    "TrainConfig",
    "TrainingError",
    "WindowConfig",
    "load_train_config",
    "lr_at",
    "train",
]
