"""The ``swax`` parser and entry point: one subcommand per entry of :data:`COMMANDS`, its
options made from the entry's config dataclass (:mod:`swax.cli.options`)."""

from __future__ import annotations

import argparse
import inspect
import os
import re
import sys

from swax.cli import options as C
from swax.cli.args import add_arguments, from_args
from swax.cli.data import cmd_data_far_share, cmd_data_prepare, cmd_data_verify
from swax.cli.demo import cmd_demo
from swax.cli.evaluate import (
    cmd_eval_compare,
    cmd_eval_convert_tasks,
    cmd_eval_niah,
    cmd_eval_ppl,
    cmd_eval_recall,
    cmd_eval_tasks,
)
from swax.cli.export import EXPORT_COMMANDS
from swax.cli.generate import cmd_generate
from swax.cli.importing import IMPORT_COMMANDS
from swax.cli.info import cmd_info
from swax.cli.memory import CopiesConfig, PasskeyConfig, cmd_eval_copies, cmd_eval_passkey
from swax.cli.sweep import cmd_sweep
from swax.cli.train import cmd_plot_run, cmd_train
from swax.core.errors import ConfigError, SwaxError, is_disk_full
from swax.core.threads import ACCEPTED as THREADS_ACCEPTED
from swax.core.threads import AUTO, parse_threads, set_threads, threads_setting
from swax.core.threads import ENV as THREADS_ENV
from swax.train.config import train_config_keys
from swax.version import __version__

DESCRIPTION = (
    "swax: train, evaluate and generate with hybrid sliding-window attention + recurrent models."
)


class _Parser(argparse.ArgumentParser):
    """argparse with one-line usage errors: ``swax: error: … (see swax generate --help)``.
    A value that starts with a minus and a digit (``--lengths -1k``) is read as the option's
    value, as plain negative numbers are, so that its own check names it."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = re.compile(r"^-\.?\d")

    def error(self, message: str):
        self.exit(2, f"swax: error: {message} (see {self.prog} --help)\n")


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions and epilogs as written (line breaks kept); wider option column."""

    def __init__(self, prog: str):
        super().__init__(prog, max_help_position=32)


COMMANDS: dict = {
    "info": (C.InfoConfig, cmd_info, "parameters and FLOPs of a preset or checkpoint"),
    "generate": (C.GenerateConfig, cmd_generate, "generate text with constant-memory decoding"),
    "train": (C.TrainArgs, cmd_train, "train a model (default: the tiny preset on the KJV)"),
    "plot-run": (C.PlotRunConfig, cmd_plot_run, "draw a run's loss curves (per window) to a PNG"),
    "eval": {
        "niah": (C.NiahConfig, cmd_eval_niah, "RULER needle-in-a-haystack at long lengths"),
        "tasks": (C.TasksConfig, cmd_eval_tasks, "short-context tasks: ARC, HellaSwag, PIQA, …"),
        "ppl": (C.PplConfig, cmd_eval_ppl, "loss by position beyond the training length"),
        "compare": (C.CompareConfig, cmd_eval_compare, "merge results folders into one table"),
        "convert-tasks": (
            C.ConvertTasksConfig,
            cmd_eval_convert_tasks,
            "write a task's data file from a Parquet or saved Hugging Face dataset",
        ),
        "recall": (C.RecallConfig, cmd_eval_recall, "key-value recall against length and window"),
        "copies": (CopiesConfig, cmd_eval_copies, "copy gain by reach on held-out text"),
        "passkey": (PasskeyConfig, cmd_eval_passkey, "a planted passkey retrieved by distance"),
    },
    "export": EXPORT_COMMANDS,
    "import": IMPORT_COMMANDS,
    "sweep": (C.SweepArgs, cmd_sweep, "train and evaluate a family of runs (resumable)"),
    "demo": (
        C.DemoConfig,
        cmd_demo,
        "the default job: train the tiny model, then generate; `swax demo recall`: the "
        "window effect on recall (two small models, about 4 minutes)",
    ),
    "data": {
        "prepare": (
            C.DataPrepareConfig,
            cmd_data_prepare,
            "tokenize a corpus into memory-mapped shards",
        ),
        "verify": (C.DataVerifyConfig, cmd_data_verify, "check a shard set's SHA-256 sums"),
        "far-share": (
            C.DataFarShareConfig,
            cmd_data_far_share,
            "the share of a corpus's targets that only a copy from beyond a window predicts",
        ),
    },
}
"""command -> (config dataclass, function, one-line help); "eval" holds its subcommands."""


def _train_keys() -> str:
    """The keys ``swax train`` accepts, for its --help."""

    rows = train_config_keys()
    width = max(len(k) for k, _, _ in rows)
    lines = [f"  {k:<{width}}  {doc}" + (f" [{d}]" if d else "") for k, d, doc in rows]
    return "config keys (YAML or key=value; [default]):\n" + "\n".join(lines)


def _add_command(sub, name: str, entry: tuple) -> None:
    cls, fn, help_text = entry
    epilog = _train_keys() if cls is C.TrainArgs else None
    sp = sub.add_parser(
        name,
        help=help_text,
        description=inspect.cleandoc(cls.__doc__ or ""),
        epilog=epilog,
        formatter_class=_HelpFormatter,
    )
    add_arguments(sp, cls)
    sp.add_argument(
        "--threads",
        type=_threads_arg,
        metavar="N",
        default=argparse.SUPPRESS,
        help=f"CPU threads of torch: auto (the usable CPUs less what other processes use now), "
        f"0 (one per usable CPU) or N; default ${THREADS_ENV}, else auto",
    )
    sp.set_defaults(fn=fn, config_cls=cls)


def _threads_arg(text: str) -> int | str:
    try:
        return parse_threads(text)
    except ConfigError:
        raise argparse.ArgumentTypeError(f"expected {THREADS_ACCEPTED}, got {text!r}") from None


def build_parser() -> argparse.ArgumentParser:
    """The ``swax`` parser: one subcommand per entry of :data:`COMMANDS`, its options made
    from the entry's config dataclass."""

    p = _Parser(prog="swax", description=DESCRIPTION, formatter_class=_HelpFormatter)
    p.add_argument("--version", action="version", version=f"swax {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for name, entry in COMMANDS.items():
        if isinstance(entry, dict):
            what = {"eval": "evaluate", "export": "export for other tools"}.get(name, name)
            what = {"import": "import from other tools"}.get(name, what)
            group = sub.add_parser(name, help=f"{what}: {', '.join(entry)}")
            esub = group.add_subparsers(dest=f"{name}_command", metavar=name.upper())
            for sub_name, sub_entry in entry.items():
                _add_command(esub, sub_name, sub_entry)
        else:
            _add_command(sub, name, entry)
    return p


COMPUTE_COMMANDS = ("train", "eval", "generate", "demo", "sweep", "export")
"""Commands whose speed depends on the thread count: ``auto`` watches the load before they run,
and they say what it chose (:func:`swax.core.threads.threads_note`)."""


def _subcommand(args) -> list[str]:
    """The subcommand of a command group (eval, export, data), if one was given."""
    name = getattr(args, "command", None)
    return [getattr(args, f"{name}_command", None) or ""] if name else []


CONFIG_COMMANDS = ("train", "demo")
"""Commands that take config keys as key=value (``--key=value`` and ``--key value`` too)."""


def _dashed_overrides(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """``swax train --steps=10 --optim.lr 3e-4`` -> ``swax train steps=10 optim.lr=3e-4``: the
    spellings people bring from other tools, for the config keys of train and demo. The
    command's own options (``--threads``, ``--help``) are left to argparse; ``--seq-len`` is
    seq_len; any other ``--name`` is taken for a key, so that a misspelled one gets the config's
    "did you mean"."""
    if not argv or argv[0] not in CONFIG_COMMANDS:
        return argv
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    options = set(sub.choices[argv[0]]._option_string_actions)

    def key_of(token: str) -> str | None:
        name = token.split("=", 1)[0]
        if name in options or not re.fullmatch(r"--[A-Za-z_][\w.-]*", name):
            return None
        return name[2:].replace("-", "_")

    out, i = [argv[0]], 1
    while i < len(argv):
        tok = argv[i]
        key = key_of(tok) if tok.startswith("--") and len(tok) > 2 else None
        if key is None:
            out.append(tok)
        elif "=" in tok:
            out.append(f"{key}={tok.split('=', 1)[1]}")
        elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            out.append(f"{key}={argv[i + 1]}")
            i += 1
        else:
            out.append(tok)  # --key without a value: argparse names it
        i += 1
    return out


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = _dashed_overrides(parser, list(sys.argv[1:] if argv is None else argv))
    args, extra = parser.parse_known_args(argv)
    # key=value overrides after an option (swax train steps=9 --threads 1 seq_len=64): argparse
    # ends a positional list at the first option; the rest join it
    dest = {C.TrainArgs: "args", C.DemoConfig: "overrides"}.get(getattr(args, "config_cls", None))
    if extra and dest and not any(x.startswith("-") for x in extra):
        setattr(args, dest, [*getattr(args, dest, []), *extra])
    elif extra:
        where = " ".join(x for x in (args.command, *_subcommand(args)) if x)
        prog = f"swax {where}" if where else "swax"
        parser.exit(
            2, f"swax: error: unrecognized arguments: {' '.join(extra)} (see {prog} --help)\n"
        )
    if not getattr(args, "fn", None):
        if isinstance(COMMANDS.get(getattr(args, "command", None)), dict):
            parser.parse_args([args.command, "--help"])
        parser.print_help()
        return 0
    try:
        threads = threads_setting(getattr(args, "threads", None))
        if threads == AUTO and args.command not in COMPUTE_COMMANDS:
            threads = 0  # nothing heavy to run: no need to watch the load first
        set_threads(threads)
        return args.fn(from_args(args.config_cls, args))
    except KeyboardInterrupt as e:  # TrainingStopped (a signal, checkpoint saved) or Ctrl-C
        if not getattr(e, "reported", False):  # training's stop line is printed by rank 0
            print(f"swax: {str(e) or 'interrupted'}", file=sys.stderr)
        return getattr(e, "exit_code", 130)
    except SwaxError as e:  # a user error; anything else is a bug: its traceback shows
        if os.environ.get("SWAX_DEBUG"):
            raise
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        print(f"swax: error: {msg}", file=sys.stderr)
        return 2
    except OSError as e:
        if not is_disk_full(e) or os.environ.get("SWAX_DEBUG"):
            raise
        where = f" writing {e.filename}" if getattr(e, "filename", None) else ""
        print(
            f"swax: error: no space left on the device{where}; free some space and run "
            "again (what was saved before is intact)",
            file=sys.stderr,
        )
        return 2


if __name__ == "__main__":
    sys.exit(main())
