"""One exception family; every message says what was wrong and what to do about it."""


class LongevalError(Exception):
    """Base class: the CLI prints these as one clear line instead of a traceback."""


class ConfigError(LongevalError):
    """A config key, value or override is wrong."""


class UnknownTaskError(ConfigError):
    """A task name that is not in the registry."""


class DataFileError(LongevalError):
    """A user-supplied data file is missing or not in the expected format."""


class ModelPathError(LongevalError):
    """The model or tokenizer folder is missing or unusable."""


class LengthError(LongevalError):
    """A target length cannot hold the task's template, question and output budget."""


class StoreError(LongevalError):
    """A run root cannot be read or written."""


class DamagedShardError(StoreError):
    """A committed shard whose bytes no longer match its commit record; it has been set aside to be redone."""


class LeaseHeldError(StoreError):
    """Another live process holds the run root's lease: two writers would do the same work twice."""
