"""Run model-written Python programs (HumanEval, MBPP) with their tests, in a sandbox.

:func:`run_program` runs one program (the candidate code followed by its test asserts) and
says whether it ran to its end without an exception; :func:`run_programs` runs many, in
parallel; :func:`landlock_abi` is the Landlock ABI the kernel offers. :class:`ExecResult`
holds the outcome, with the guards that applied to the run.

The host side lives in :mod:`.host` (with :mod:`.host_process` and :mod:`.host_verdict`);
``launcher.py`` and the runner are the two programs it runs in fresh interpreters (passed as
text, they import nothing from swax). The runner's text is ``runner_guard.py`` (the Python
guard), ``runner_audit.py`` (the audit hook) and ``runner.py`` (the rest), joined in this order.

The guards: docs/sandbox.md.
"""

from swax.eval.sandbox.host import ExecResult, landlock_abi, run_program, run_programs

__all__ = ["ExecResult", "run_program", "run_programs", "landlock_abi"]
