"""swax: hybrid sliding-window attention + linear recurrent language models.

from swax import SwaxConfig, SwaxLM
model = SwaxLM(SwaxConfig.preset("tiny"))
logits = model(input_ids, window=128)
"""

from swax.config import PRESETS, SwaxConfig
from swax.core.errors import CheckpointError, ConfigError, InputError, SwaxError
from swax.model import SwaxLM
from swax.state import SwaxState
from swax.version import __version__

__all__ = [
    "PRESETS",
    "CheckpointError",
    "ConfigError",
    "InputError",
    "SwaxConfig",
    "SwaxError",
    "SwaxLM",
    "SwaxState",
    "__version__",
]
