"""Data configs: where the documents come from, how they are tokenized and split, and the
share of synthetic retrieval episodes mixed into training."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from swax.core.configs import bounded, check_fields, from_dict
from swax.core.errors import ConfigError


@dataclass
class SyntheticConfig:
    """RULER-style retrieval episodes mixed into the training stream (see swax.data.synthetic)."""

    task: Literal["needle", "mqar"] = "needle"
    """needle: RULER-style needles hidden in corpus text (swax.data.synthetic); mqar:
    multi-query associative recall, key-value pairs of dedicated token ids queried again after
    a stretch of filler (swax.data.mqar), the task small models learn in minutes."""
    fraction: float = bounded(0.0, "[0, 1]")
    """Share of the training sequences of an epoch that are retrieval episodes, in [0, 1];
    1 = episodes only (no corpus text in training; validation still reads the corpus)."""
    compact: bool = False
    """Short format for tiny models: needle "{key}:{value}." with single-word keys, question
    "?{key}:", answer "{value}". False = RULER's sentences with adjective-noun keys."""
    num_needles: int = bounded(1, "[1, inf)")
    """Needles per episode; the first is queried, the others are distractors with other keys."""
    num_queries: int = bounded(1, "[1, inf)")
    """Needles queried at the end of the episode (question + answer each, one after the other,
    as in RULER's niah_multiquery); at most num_needles. More queries give more supervised
    retrieval tokens per episode."""
    answers_only: bool = False
    """Train on the answer tokens of an episode only (its haystack text is not a target);
    focuses the episodes on retrieval. Corpus sequences are unaffected."""
    supervise_filler: bool = False
    """mqar with answers_only: also train on the episode's filler (with mqar_noise=0, corpus
    text), but not on the pairs or the query keys. Each episode is then a language-modelling
    sequence as well, with the answers a small share of its targets."""
    min_distance: int = bounded(16, "[0, inf)")
    """Fewest tokens between the end of the queried needle and the start of the question."""
    max_distance: int | None = bounded(None, "[0, inf)")
    """Most tokens between the queried needle and the question; None = as far as the sequence
    allows. The distance is drawn uniformly in [min_distance, max_distance]."""
    far_share: float | None = bounded(None, "[0, 1]")
    """Share of episodes whose every answer lies beyond window ``far_from`` (the question
    does not attend to the value under that window); the others have every answer inside it.
    Each kind is uniform over the distances that give it (swax.data.episode.draw_distance).
    None = one draw over [min_distance, max_distance] (``distance_law``). With far_from the
    long window, far_share is the share of training answers that only a recurrent memory can
    reach."""
    far_from: int | None = bounded(None, "[1, inf)")
    """The window that splits near from far episodes: an answer is inside window W when the
    position that predicts it attends to the value under sliding_window_attention's mask
    (it sees W tokens, itself included). None = the run's long window (window.long)."""
    distance_law: Literal["uniform", "power"] = "uniform"
    """Distances when far_share is None: uniform in [min_distance, max_distance], or a
    heavy, text-like tail: P(d) ∝ (d - min_distance + 1)^-distance_power (Zoology's MQAR
    draws its gaps from such a power law)."""
    distance_power: float = bounded(1.0, "(0, inf)")
    """Exponent of distance_law: power (1.0: about as many answers in [8, 16) as in
    [64, 128))."""
    answer_weight: float = bounded(1.0, "(0, inf)")
    """Weight of each answer token in the training loss, relative to a text token's 1 (the
    loss is the weighted mean over target tokens). Above 1 it strengthens the retrieval signal
    in a text mixture, where answers are a small share of the targets."""
    value_digits: int | None = bounded(None, "[1, 18]")
    """Digits of the magic numbers; None = 7 (RULER) or 4 with ``compact``."""
    mqar_first_id: int | None = bounded(None, "[0, inf)")
    """mqar: first token id of the key range; the value range and the filler range follow it.
    None (the default) = the tokenizer's vocabulary size: the episode ids lie after every id
    the tokenizer can produce, so no text can emit them, and training grows the model's
    vocabulary to hold them. An id inside the vocabulary is checked against the training text
    when the loader starts (an error names every clashing id and where it occurs)."""
    mqar_keys: int = bounded(16, "[1, inf)")
    """mqar: number of distinct key tokens (at least num_needles)."""
    mqar_values: int = bounded(16, "[1, inf)")
    """mqar: number of distinct value tokens (chance of a guess: 1 / mqar_values)."""
    mqar_distractors: float = bounded(0.0, "[0, 1)")
    """mqar: share of the filler tokens replaced by value tokens (drawn uniformly from the
    value range). With distractors the answer is no longer the only value in the context:
    it must be looked up by its key (the token after the key's first occurrence), which is
    the binding that attention does and a memory of "the odd token" does not."""
    mqar_noise: int = bounded(16, "[0, inf)")
    """mqar: number of filler tokens drawn uniformly between and around the pairs; 0 = the
    filler is a slice of the corpus text."""

    def __post_init__(self):
        if self.task not in ("needle", "mqar"):
            raise ConfigError(
                f"data.synthetic.task: expected 'needle' or 'mqar', got {self.task!r}"
            )
        check_fields(self, prefix="data.synthetic.")
        if self.task == "mqar" and self.num_needles > self.mqar_keys:
            raise ConfigError(
                f"data.synthetic.num_needles: {self.num_needles} MQAR pairs need as many distinct "
                f"keys, but mqar_keys={self.mqar_keys}"
            )
        if not 1 <= self.num_queries <= self.num_needles:
            raise ConfigError(
                f"data.synthetic.num_queries: expected 1 to num_needles "
                f"({self.num_needles}), got {self.num_queries!r}"
            )
        if self.supervise_filler and not (self.task == "mqar" and self.answers_only):
            raise ConfigError(
                "data.synthetic.supervise_filler needs task: mqar and answers_only: true"
            )
        if self.distance_law not in ("uniform", "power"):
            raise ConfigError(
                "data.synthetic.distance_law: expected 'uniform' or 'power', got "
                f"{self.distance_law!r}"
            )
        if self.max_distance is not None and self.max_distance < self.min_distance:
            raise ConfigError(
                f"data.synthetic.max_distance: expected >= min_distance "
                f"({self.min_distance}), got {self.max_distance!r}"
            )

    @property
    def digits(self) -> int:
        """The number of digits actually used."""
        if self.value_digits is not None:
            return self.value_digits
        return 4 if self.compact else 7


@dataclass
class DataConfig:
    """Training and validation data."""

    source: str = "kjv"
    """Documents: "kjv" (the embedded King James Bible), "pystdlib" (the Python standard
    library's own .py files: real code on every machine), a text file, a folder of .txt/.md
    files, a .jsonl or .parquet file, or a Hugging Face dataset folder (save_to_disk)."""
    format: str = "auto"
    """auto | kjv | text | jsonl | parquet | hf; auto picks by extension and folder contents."""
    field: str = "text"
    """Field (JSONL) or column (Parquet, Hugging Face datasets) that holds the text."""
    tokenizer: str = "byte"
    """"byte", "gpt2", a tokenizer.json path, or a folder with tokenizer.json or
    encoder.json + vocab.bpe."""
    val_source: str | None = None
    """Validation documents (same format and field); None = hold out val_fraction of source."""
    val_fraction: float = bounded(0.02, "[0, 1)")
    """Share of the source's documents held out for validation when val_source is None, chosen
    by a hash of each document's text (and split_seed), so the split is stable across runs.
    0 = no validation set."""
    split_seed: int = bounded(0, "(-inf, inf)")
    """Seed of the train/validation hash; independent of the run seed so that runs with
    different seeds share one validation set."""
    synthetic: SyntheticConfig = dataclasses.field(default_factory=SyntheticConfig)
    """Synthetic retrieval episodes mixed into training."""
    doc_mask: bool = False
    """Packed documents stay apart: every layer sees only its own document (attention masks
    earlier documents, recurrent states and convolutions restart, RoPE positions count from the
    document's start). Documents end at the tokenizer's end-of-text token; an episode is one
    document. Off by default: a packed row is one stream."""

    def __post_init__(self):
        if isinstance(self.synthetic, dict):
            self.synthetic = from_dict(SyntheticConfig, self.synthetic, prefix="data.synthetic.")
        check_fields(self, prefix="data.")
