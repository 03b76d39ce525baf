"""The infrastructure every other package stands on, and nothing of the model's math.

- :mod:`~swax.core.errors`: the user-error classes (one line, exit status 2 at the command line);
- :mod:`~swax.core.configs`: dataclass configs (field docstrings, coercion, bounds, YAML);
- :mod:`~swax.core.paths`, :mod:`~swax.core.integrity`: writing folders safely, checksums;
- :mod:`~swax.core.threads`, :mod:`~swax.core.signals`, :mod:`~swax.core.progress`: thread count
  by load, stop requests, progress lines;
- :mod:`~swax.core.plotting`: matplotlib without a display.

It imports nothing from swax outside itself.
"""
