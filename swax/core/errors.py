"""Exceptions for user errors: the CLI prints them as one line and exits non-zero."""


class SwaxError(Exception):
    """A user error (bad input, bad file, bad config): printed as one line, no traceback."""


class ConfigError(SwaxError, ValueError):
    """An invalid configuration value, unknown key or wrong type; the message names the key."""


class InputError(SwaxError, ValueError):
    """Invalid data given to the library (a token id outside the vocabulary, an empty prompt);
    a ValueError too, so ``except ValueError`` still catches it."""


class CheckpointError(SwaxError):
    """A missing, corrupt or mismatched checkpoint; the message names the file."""


class CorruptCheckpointError(CheckpointError):
    """A checkpoint or model file that cannot be read back as written (bad checksum, truncated
    or unparsable file); resuming falls back to the checkpoint before it."""


class DiskFullError(SwaxError):
    """The device ran out of space (or quota) while swax was writing; what was written before
    is intact, and the partial file is removed."""


def is_disk_full(error: BaseException) -> bool:
    """Whether ``error`` says the device or the quota is full: an OSError with ENOSPC or EDQUOT,
    or an error of a writer that reports it only in its message (safetensors)."""
    import errno

    if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    text = str(error)
    return "No space left on device" in text or "Disk quota exceeded" in text
