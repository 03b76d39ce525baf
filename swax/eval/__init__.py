"""Evaluation: RULER needle-in-a-haystack, short-context tasks, perplexity by position."""
