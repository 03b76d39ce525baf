"""Retrieval probes on synthetic episodes, shared by training (the laziness monitor) and
evaluation (``swax eval recall``, the sweeps): accuracy on key-value episodes at any length
(:mod:`~swax.probes.episodes`) and recall by distance bucket with the window-cut and
recurrent-reset probes (:mod:`~swax.probes.buckets`)."""
