"""The studies of swax, one subpackage per question (docs/studies.md; the index:
experiments/README.md).

Each study runs as ``python -m experiments.<study> run|report`` from the repository root (or with
the root on ``PYTHONPATH``); the code they share is :mod:`experiments.lab`. A study may read
another study's committed results through that study's modules (the text study reads the
laziness map's ρ*); nothing reads ``regime_study``, which reads the others together, and
``lab`` imports no study (`make lint`: tools/check_imports.py). Nothing in ``swax`` imports
this package.
"""
