"""swax: hybrid sliding-window attention + linear recurrent language models.

from swax import SwaxConfig, SwaxLM
model = SwaxLM(SwaxConfig.preset("tiny"))
logits = model(input_ids, window=128)
"""

__version__ = "0.1.0"

from .config import PRESETS, SwaxConfig  # noqa: E402
from .errors import CheckpointError, ConfigError, SwaxError  # noqa: E402
from .model import SwaxLM, SwaxState  # noqa: E402

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
