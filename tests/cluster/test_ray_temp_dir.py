"""Ray's temp dir: its socket paths must fit in AF_UNIX's 107 bytes whatever TMPDIR is (no Ray needed)."""

from __future__ import annotations

from longeval.cluster.ray_runtime import AF_UNIX_MAX, RAY_SOCKET_SUFFIX, ray_temp_dir

# What Ray appends below its temp dir, measured from a real failure in CI.
SOCKET = "/session_2026-11-22_11-55-01_452831_21479/sockets/plasma_store"


def test_short_tmpdir_is_used_as_is():
    assert ray_temp_dir("/tmp") == "/tmp/ray"


def test_long_tmpdir_gets_a_short_ray_dir():
    long_tmp = "/check/work/main/.cache/tmp/session-4z09ihnh"
    chosen = ray_temp_dir(long_tmp)
    assert chosen.startswith("/tmp/ray-")
    assert len((chosen + SOCKET).encode()) <= AF_UNIX_MAX
    # the same TMPDIR always maps to the same folder; another TMPDIR to another
    assert ray_temp_dir(long_tmp) == chosen
    assert ray_temp_dir(long_tmp + "x") != chosen


def test_suffix_covers_rays_real_socket_path():
    assert len(SOCKET) <= RAY_SOCKET_SUFFIX
