"""The processes of a run: Ray's start and its errors, the reaper of a private Ray, launching as a Ray job, and
Ctrl-C and SIGTERM.

The names below are the package's public surface; each lives in the module named beside it and is imported
when first used."""

from longeval._lazy import lazy_exports

_EXPORTS = {
    "check_shared_storage": "ray_runtime",
    "command_line": "launch",
    "free_ports": "launch",
    "init_ray": "ray_runtime",
    "loopback_cluster": "launch",
    "map_pool": "ray_runtime",
    "ray_temp_dir": "ray_runtime",
    "runtime_env": "launch",
    "sweep": "launch",
    "tagged_pids": "launch",
    "unwrap_ray_errors": "ray_runtime",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
