"""swax: hybrid sliding-window attention + linear recurrent language models.

from swax import SwaxConfig, SwaxLM
model = SwaxLM(SwaxConfig.preset("tiny"))
logits = model(input_ids, window=128)
"""

from .config import PRESETS, SwaxConfig
from .errors import CheckpointError, ConfigError, SwaxError
from .model import SwaxLM
from .state import SwaxState
from .version import __version__

__all__ = [
    "PRESETS",
    "CheckpointError",
    "ConfigError",
    "SwaxConfig",
    "SwaxError",
    "SwaxLM",
    "SwaxState",
    "__version__",
]
