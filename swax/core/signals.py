"""Deferred SIGINT / SIGTERM: long work (training, data preparation) stops at a consistent point.

The first Ctrl-C (SIGINT) or SIGTERM (what SLURM and most schedulers send before preemption)
only sets :attr:`StopSignals.signum`; the work checks it at its own boundaries (a training step,
a batch of documents), saves what it must and stops. A second signal stops at once.
"""

from __future__ import annotations

import os
import signal
import threading

__all__ = ["StopSignals", "Stopped"]


class Stopped(KeyboardInterrupt):
    """Work stopped on a signal after saving what it had; ``exit_code`` is the shell's
    convention (128 + the signal number: 130 for SIGINT, 143 for SIGTERM)."""

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.signum = signum
        self.exit_code = 128 + signum


class StopSignals:
    """Within the ``with`` block, SIGINT and SIGTERM set :attr:`signum` instead of stopping
    the process, so that long work can stop at a point where what it saved is consistent; a
    second SIGINT (a second Ctrl-C) raises KeyboardInterrupt at once. A repeated SIGTERM is
    ignored: schedulers send it more than once (SLURM to every process of a job step, torchrun
    forwarding its own copy), and it must not cancel the checkpoint. Outside the main thread
    (where Python cannot install handlers) it does nothing."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(
        self,
        what: str = "swax train",
        action: str | None = "stopping after the current step with a checkpoint",
    ):
        self.what = what
        self.action = action
        """What the first signal does, said on stderr (None: say nothing)."""
        self.signum: int | None = None
        self._old: dict = {}

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum else ""

    def _handle(self, signum, frame) -> None:
        if self.signum is not None and signum == signal.SIGTERM:
            # schedulers repeat it (SLURM signals every process of the step, and torchrun
            # forwards its own copy to the workers): only a second Ctrl-C means "now"
            return
        if self.signum is not None:
            self._restore()
            _say(f"{self.what}: second {signal.Signals(signum).name}: stopping now, without saving")
            raise KeyboardInterrupt
        self.signum = signum
        if self.action:
            _say(
                f"{self.what}: {signal.Signals(signum).name} received: {self.action} (Ctrl-C "
                f"again stops at once, without saving)"
            )

    def _restore(self) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)
        self._old = {}

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        self._restore()


def _say(text: str) -> None:
    # os.write, not print: a handler may run while the main thread is inside print()
    try:
        os.write(2, (text + "\n").encode())
    except OSError:
        pass
