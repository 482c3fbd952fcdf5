"""What a run must never write: credentials, found by name and hidden by value.

One `Redactor`, built from the config and the environment (`Redactor.of`), serves every place that writes config or
environment to disk or W&B: the run root's config.yaml, the engine records, W&B's config, names, tags and warnings.
It knows three kinds of secret:

- every value under `model.env` (it goes to the engine's environment, and only the user knows what it is), except
  the engine settings in `PUBLIC_ENV`;
- the value of every secret-named setting, at any depth, and of every secret-named environment variable
  (`is_secret_name`);
- the user info of every URL (`scheme://user:password@host`), in the config or the environment.

A secret is hidden where it appears as a whole value (its own key, or any string equal to it) and, when it has
`MIN_SECRET_CHARS` characters or more, inside any other text too: a password pasted into a tag, a token echoed in a
W&B warning. A key the user lists in `public_keys` is none of these.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

__all__ = ["HIDDEN", "MIN_SECRET_CHARS", "PUBLIC_ENV", "Redactor", "is_secret_name", "redacted_logs"]

HIDDEN = "***"

SECRET_WORDS = ("secret", "password", "passwd", "passphrase", "credential", "api_key", "apikey", "access_key",
                "private_key", "authorization")
"""Parts of a key name that mark a credential wherever they appear in it."""
SECRET_NAME_WORDS = ("token", "pass", "auth", "cookie")
"""Words that mark a credential only as a whole word of the name: `HF_TOKEN`, `DB_PASS`, `basic_auth`, but not
`max_num_batched_tokens`, `passed` or `author`."""
SECRET_SUFFIXES = ("key", "pwd")
"""Last words that mark a credential in an environment-style (upper case) name of two words or more: `OPENAI_KEY`,
`DB_PWD`, but not `PWD` (the working directory) and not a task parameter such as `type_key` or a column `key`."""
DESCRIPTOR_SUFFIXES = ("mode", "type", "method", "enabled", "disabled", "sock", "socket", "host", "port", "url",
                       "uri", "endpoint", "dir", "path", "file", "user", "username", "name", "env", "timeout")
"""Last words that make a name describe a credential rather than hold one (`RAY_AUTH_MODE`, `SSH_AUTH_SOCK`,
`HF_TOKEN_PATH`, `api_key_env`) for the whole-word and suffix rules; a URL's user info is found in its value."""

URL_USERINFO = re.compile(r"([a-z][a-z0-9+.-]*://)([^/@\s]+)@", re.IGNORECASE)
"""`scheme://user:password@host`: the user info of a URL is a credential wherever it appears."""
MIN_SECRET_CHARS = 6
"""Shorter secrets are hidden only as whole values, never inside other text (they would hit ordinary words)."""

PUBLIC_ENV = frozenset({
    "VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_NUM_OF_RESERVED_CPU",
    "VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_ATTENTION_BACKEND", "VLLM_ALLOW_LONG_MAX_MODEL_LEN", "VLLM_USE_V1",
    "VLLM_LOGGING_LEVEL", "VLLM_WORKER_MULTIPROC_METHOD", "OMP_NUM_THREADS", "TOKENIZERS_PARALLELISM",
    "OMP_WAIT_POLICY", "CUDA_VISIBLE_DEVICES", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "VLLM_BATCH_INVARIANT",
})
"""`model.env` variables that are engine settings, never credentials: written in clear, so a run's config.yaml
keeps what shaped its engine (the presets set some). Any other `model.env` value is hidden unless listed in
`public_keys`."""


def is_secret_name(key: Any) -> bool:
    """Whether a key names a credential: HF_TOKEN, DB_PASS, OPENAI_KEY, auth, api_key, AWS_SECRET_ACCESS_KEY...
    but not `tokenizer` (a path), `max_num_batched_tokens` (a number), `type_key` or `PWD`."""
    raw = str(key)
    name = raw.lower().replace("-", "_")
    words = [w for w in re.split(r"[^a-z0-9]+", name) if w]
    if not words or words[-1] == "env":  # names the variable that holds a credential (api.api_key_env)
        return False
    if any(word in name for word in SECRET_WORDS):
        return True
    if words[-1] in DESCRIPTOR_SUFFIXES:
        return False
    return any(w in SECRET_NAME_WORDS for w in words) or (raw.isupper() and len(words) > 1
                                                         and words[-1] in SECRET_SUFFIXES)


def url_secrets(text: str) -> Iterator[str]:
    """The user info of every URL in `text`, whole and its password alone."""
    for match in URL_USERINFO.finditer(text):
        userinfo = match.group(2)
        yield userinfo
        if ":" in userinfo:
            yield userinfo.split(":", 1)[1]


@dataclass(frozen=True)
class Redactor:
    """Hides secrets in anything about to be written: `tree` for configs and records, `text` for free text.

    Build it with `Redactor.of`; it pickles, but is rebuilt where it is used (an engine actor builds its own from
    the model settings and its own environment), so no secret travels that was not already travelling.
    """

    names: frozenset[str] = frozenset()
    """Keys whose values are hidden wherever they appear (model.env's keys), besides secret-named ones."""
    secrets: tuple[str, ...] = ()
    """Every secret value, longest first (so a secret that contains another is replaced whole)."""
    public: frozenset[str] = frozenset()
    """Keys the user declared not secret (`public_keys`)."""

    @classmethod
    def of(cls, tree: Mapping[str, Any] | None = None, *, public: Iterable[str] = (),
           environ: Mapping[str, str] | None = None) -> Redactor:
        """The secrets of a config (a whole one, or a part such as `{"model": ...}`) and of the environment.

        `public` adds to the tree's own `public_keys`; `environ` defaults to this process's environment.
        """
        tree = dict(tree or {})
        public = frozenset(public) | frozenset(tree.get("public_keys") or ())
        names: set[str] = set()
        found: set[str] = set()
        model = tree.get("model")
        env = model.get("env") if isinstance(model, Mapping) else None
        for key, value in (env or {}).items():
            if key not in public and key not in PUBLIC_ENV:
                names.add(str(key))
                found.add(str(value))

        def walk(node: Any, hidden: bool) -> None:
            if isinstance(node, Mapping):
                for key, value in node.items():
                    walk(value, hidden or (key not in public and is_secret_name(key)))
            elif isinstance(node, list | tuple):
                for value in node:
                    walk(value, hidden)
            elif isinstance(node, str | int) and not isinstance(node, bool):
                if hidden:
                    found.add(str(node))
                if isinstance(node, str):
                    found.update(url_secrets(node))

        walk(tree, False)
        for key, value in (os.environ if environ is None else environ).items():
            if key not in public and is_secret_name(key):
                found.add(value)
            found.update(url_secrets(value))
        found.discard("")
        found.discard(HIDDEN)
        return cls(frozenset(names), tuple(sorted(found, key=lambda s: (-len(s), s))), public)

    def hides(self, key: Any) -> bool:
        """Whether the value under `key` is hidden whole."""
        return key not in self.public and (key in self.names or is_secret_name(key))

    def text(self, text: str) -> str:
        """`text` with URL user info and every secret long enough to be told from ordinary words replaced."""
        text = URL_USERINFO.sub(rf"\1{HIDDEN}@", text)
        for value in self.secrets:
            if len(value) >= MIN_SECRET_CHARS:
                text = text.replace(value, HIDDEN)
        return text

    def tree(self, obj: Any) -> Any:
        """`obj` (dicts, lists, scalars) with secret-keyed values and secrets hidden at any depth, keys included;
        an unset value (None) stays None, so a record still tells "not set" from "hidden"."""
        if isinstance(obj, Mapping):
            return {(self.text(k) if isinstance(k, str) else k):
                    (HIDDEN if value is not None and self.hides(k) else self.tree(value))
                    for k, value in obj.items()}
        if isinstance(obj, list | tuple):
            return [self.tree(v) for v in obj]
        if isinstance(obj, str):
            return HIDDEN if obj in self.secrets else self.text(obj)
        return obj


class _LogFilter(logging.Filter):
    """Hides secrets in every record a handler emits: a message that quotes a URL, an error naming a setting."""

    def __init__(self, redactor: Redactor) -> None:
        super().__init__()
        self.redactor = redactor

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        hidden = self.redactor.text(message)
        if hidden != message:
            record.msg, record.args = hidden, None
        return True


@contextmanager
def redacted_logs(redactor: Redactor) -> Iterator[None]:
    """Pass the process's own log lines (the root logger's handlers, where every logger's records end) through
    `redactor` while the block runs: files and W&B were redacted before, the terminal and a job's log were not."""
    handlers = list(logging.getLogger().handlers)
    log_filter = _LogFilter(redactor)
    for handler in handlers:
        handler.addFilter(log_filter)
    try:
        yield
    finally:
        for handler in handlers:
            handler.removeFilter(log_filter)
