import os

import pytest
import torch

# Under pytest-xdist every worker is its own process: one thread each avoids oversubscribing
# the cores (small tensors are dominated by threading overhead anyway).
if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
