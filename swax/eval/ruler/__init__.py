"""RULER's needle-in-a-haystack tasks: data generation and scoring, offline.

A re-implementation (own code) of the NIAH part of NVIDIA's RULER benchmark
(github.com/NVIDIA/RULER, ``scripts/``), written to produce the same prompts:

- **Task settings** (:data:`TASKS`): the eight ``niah_*`` entries of ``synthetic.yaml``
  (type_haystack, type_needle_k, type_needle_v, num_needle_k/v/q); ``num_needle_k`` is raised to
  ``num_needle_q`` as ``niah.py`` does at start-up.
- **Template, answer prefix, tokens to generate** (:data:`TEMPLATE`, :data:`ANSWER_PREFIX`,
  :data:`TOKENS_TO_GENERATE` = 128): ``data/synthetic/constants.py`` ``TASKS['niah']``, joined
  as ``prepare.py`` ``main`` does with the ``base`` model template of ``data/template.py``
  (``"{task_template}"``, no chat wrapper) followed by the answer prefix. The singular wording
  when ``num_needle_q * num_needle_v == 1`` ('Some'->'A', 'are all'->'is', 'are'->'is',
  'answers'->'answer', value type without its final 's') follows ``niah.py``
  ``generate_input_output``; so does cutting the formatted text at the last occurrence of the
  answer prefix's first 10 characters into ``input`` and ``answer_prefix``
  (``niah.py`` ``generate_samples``).
- **Needle and haystacks** (:data:`NEEDLE`, :data:`NOISE`): ``niah.py`` module level. The noise
  haystack repeats the noise paragraph, the ``needle`` haystack is made of distractor needles
  with random keys and values of the task's kinds; both join their sentences with newlines and
  insert the needles at indices ``random.sample(range(n), k)`` taken in decreasing order
  (``niah.py`` ``generate_input_output``). The essay haystack takes the first ``n``
  whitespace-separated words of a text (repeated when too short), splits them into sentences,
  and inserts the needles after ``int(S * depth / 100)`` of the ``S`` sentences, the depths
  drawn without replacement from :data:`DEPTHS` = 40 evenly spaced percentages
  (``np.round(np.linspace(0, 100, 40))``) and matched in increasing order to the needles,
  everything joined by single spaces (same function).
- **Keys and values**: adjective-noun words ``f"{adj}-{noun}"`` drawn uniformly from the
  product of wonderwords' ``adjectivelist.txt`` and ``nounlist.txt`` as read by
  ``wonderwords.random_word._get_words_from_text_file`` (``niah.py`` ``generate_random_word``);
  7-digit numbers ``randint(10**6, 10**7 - 1)`` (``generate_random_number``); UUIDs
  ``uuid.UUID(int=getrandbits(128), version=4)`` (``generate_random_uuid``). Needles are shuffled
  with a fresh ``random.Random(seed)`` as RULER does; the query joins several keys as
  "a, b, c, and d" and the references are the values of the queried keys in order.
- **Haystack size**: the largest haystack (in words for an essay, sentences otherwise) such that
  ``len(tokenize(input + answer_prefix)) + tokens_to_generate <= max_length`` in the tokenizer
  given (``niah.py`` ``generate_samples``); ``length`` in a record is that left-hand side.
- **Scoring**: :func:`string_match_all`, :func:`string_match_part` and :func:`postprocess_pred`
  follow ``eval/synthetic/constants.py`` and ``eval/evaluate.py`` ``postprocess_pred``.

Deviations, each for a stated reason:

- The haystack size is searched **per sample** (for that sample's keys, values and depths), and
  to one word or sentence. RULER searches once per task with one random draw and then lowers
  the size by 500 words (25 sentences) when a sample does not fit; at short lengths in a
  byte-level tokenizer that step is larger than the whole context (RULER would loop forever),
  and it leaves samples far below the target length. The search is guided by an additive
  estimate of each word's (sentence's) tokens and always checked on the exact token count of
  the full prompt, so a 131k-token prompt costs a handful of tokenizations.
- Randomness is drawn from a ``random.Random`` per sample seeded from (seed, task, length,
  sample index), so a sample does not depend on how many haystack sizes the search tried.
  Insertion indices in the noise and needle haystacks depend on the haystack size, as in RULER,
  and are drawn from their own seeded generator for each size.
- Keys within a sample are distinct, the values of a sample are distinct, and distractor
  needles never reuse a key of the sample (RULER leaves these to chance; a collision would make
  the answer ambiguous).
- Sentences are split by a small rule (a word ending in ``.``, ``!`` or ``?``, possibly followed
  by closing quotes or brackets, ends a sentence unless it is a common abbreviation or a single
  initial) instead of NLTK's punkt model, which needs a download.
- The essay haystack defaults to the King James Bible (chapter texts without their headings,
  :func:`swax.data.sources.kjv_documents`) instead of Paul Graham's essays, which RULER
  downloads; any local text can be passed instead.
- ``index`` is the sample's index (RULER's current ``niah.py`` overwrites it with the answer's
  character offset by reusing the loop variable).
- ``key_split="eval"`` (or ``"train"``) draws every adjective-noun key, distractors included,
  from :func:`swax.data.synthetic.key_vocabulary` instead of RULER's full word product.

The package: :mod:`~swax.eval.ruler.tasks` (RULER's definitions and the task table),
:mod:`~swax.eval.ruler.needles` (keys, values and needles), :mod:`~swax.eval.ruler.haystacks`
(essay, noise and distractor haystacks), :mod:`~swax.eval.ruler.records` (the haystack-size
search and :func:`generate_niah`), :mod:`~swax.eval.ruler.metrics` (scoring).
"""

from swax.data.jsonl import read_jsonl, write_jsonl
from swax.eval.ruler.haystacks import _Counts as _Counts
from swax.eval.ruler.metrics import postprocess_pred, string_match_all, string_match_part
from swax.eval.ruler.records import _fit as _fit
from swax.eval.ruler.records import generate_niah
from swax.eval.ruler.tasks import (
    ANSWER_PREFIX,
    DEPTHS,
    NEEDLE,
    NOISE,
    TASKS,
    TEMPLATE,
    TOKENS_TO_GENERATE,
    NiahTask,
)

__all__ = [
    "ANSWER_PREFIX",
    "DEPTHS",
    "NEEDLE",
    "NOISE",
    "TASKS",
    "TEMPLATE",
    "TOKENS_TO_GENERATE",
    "NiahTask",
    "generate_niah",
    "postprocess_pred",
    "read_jsonl",
    "string_match_all",
    "string_match_part",
    "write_jsonl",
]
