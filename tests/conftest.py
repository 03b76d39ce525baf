import atexit
import os
import shutil
import tempfile

# torch.compile's on-disk cache (/tmp/torchinductor_<user>) is shared by every process of the
# user: two test runs compiling the same kernel at once (two checkouts, or CI beside a developer's
# run) can read each other's half-written .so ("file too short"). Each test process gets its own.
if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
    _cache = tempfile.mkdtemp(prefix="swax-test-inductor-")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = _cache
    atexit.register(shutil.rmtree, _cache, ignore_errors=True)

# swax's per-machine cache (the MFU reference, swax.train.peak): one per test process, never
# the user's. The thread count of CLI commands run by tests: 1 (tests of the default unset it).
_swax_cache = tempfile.mkdtemp(prefix="swax-test-cache-")
os.environ["SWAX_CACHE_DIR"] = _swax_cache
atexit.register(shutil.rmtree, _swax_cache, ignore_errors=True)
os.environ.setdefault("SWAX_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

# Under pytest-xdist every worker is its own process: one thread each avoids oversubscribing
# the cores (small tensors are dominated by threading overhead anyway).
if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)


from swax.ops.triton_env import interpreting  # noqa: E402

if interpreting():  # the gpu tier on the CPU: bridges for gaps of Triton's interpreter
    pytest_plugins = ["tests.triton_interp"]


def pytest_collection_modifyitems(config, items):
    """gpu tests run on CUDA, and on the CPU under Triton's interpreter (`make
    test-gpu-interp`) except those marked ``cuda_only`` (timings, CUDA's own numerics)."""
    if torch.cuda.is_available():
        return
    if interpreting():
        skip = pytest.mark.skip(reason="needs CUDA (not a kernel check: it runs on CUDA only)")
        marker = "cuda_only"
    else:
        skip = pytest.mark.skip(reason="needs CUDA, or Triton's interpreter: make test-gpu-interp")
        marker = "gpu"
    for item in items:
        if marker in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _traced_decode_in_the_fast_tier(request, monkeypatch):
    """Outside the slow tier, compiled decode steps (swax.decode) are traced with torch.compile's
    aot_eager backend, in this process and in the commands it starts: the same graph without
    inductor's C++ compile (seconds instead of 30-70 s per test process). The slow tier compiles
    with inductor, the default."""
    if request.node.get_closest_marker("slow") is None:
        monkeypatch.setenv("SWAX_COMPILE_BACKEND", "aot_eager")


@pytest.fixture(scope="module")
def one_thread():
    """Tiny tensors: intra-op threads only add sync overhead (large on a busy 2-core box).
    Op test modules use it with ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
