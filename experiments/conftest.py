"""The studies' tests run in the library tests' environment (tests/conftest.py: one thread,
caches of their own)."""

import tests.conftest  # noqa: F401
