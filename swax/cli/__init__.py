"""swax: train, evaluate and generate with hybrid sliding-window attention + recurrent models.

    swax info --preset tiny                 # parameters, layers, FLOPs per token
    swax generate --model DIR --prompt "In the beginning" --max-new-tokens 64
    swax demo                               # the default job (see README)

Every command reads a dataclass config (:mod:`swax.cli.options`; train and sweep: YAML files
with key=value overrides); its options are made from the config's fields. User errors (a
missing file, a bad value) print one line ``swax: error: …`` and exit with status 2; set
SWAX_DEBUG=1 for a traceback.
"""

from swax.cli.main import COMMANDS, build_parser, main

__all__ = ["COMMANDS", "build_parser", "main"]
