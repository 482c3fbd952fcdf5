"""Whether W&B's server can be used by a command that needs it, and the error when it cannot.

Checked without a network call and without importing wandb, so `longeval dashboards create` (which fails without
credentials) and an online W&B run (which falls back to offline) ask the same question the same way.
"""

from __future__ import annotations

import netrc
import os
from collections.abc import Mapping
from urllib.parse import urlsplit

from longeval.errors import LongevalError

__all__ = ["TrackingError", "has_credentials"]


class TrackingError(LongevalError):
    """W&B cannot be used for a command that needs it (dashboards): no credentials, no network."""


def has_credentials(environ: Mapping[str, str] | None = None) -> bool:
    """Whether W&B credentials are at hand: WANDB_API_KEY, an identity token file, or a `wandb login` netrc
    entry for the W&B host — checked without a network call."""
    env = os.environ if environ is None else environ
    if env.get("WANDB_API_KEY") or env.get("WANDB_IDENTITY_TOKEN_FILE"):
        return True
    host = urlsplit(env.get("WANDB_BASE_URL") or "https://api.wandb.ai").hostname or "api.wandb.ai"
    try:
        auth = netrc.netrc(env.get("NETRC") or None).authenticators(host)
    except (OSError, netrc.NetrcParseError):
        return False
    return bool(auth and auth[2])

