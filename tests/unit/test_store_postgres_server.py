"""What the Postgres store says of its server, table-driven (``bot.store.postgres``): where it is,
in messages (one host or a failover pair's list, never the user or the password), and how its
commits are replicated (``Replication.of``, from the readiness probe's settings)."""

from __future__ import annotations

import pytest

from bot.store.postgres import Replication, where


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://pitcrew@db:5433/pitcrew", "postgresql://db:5433/pitcrew"),
        ("postgresql://pitcrew:secret@db/pitcrew?sslmode=verify-full", "postgresql://db:5432/pitcrew"),
        (
            "postgresql://pitcrew@a:5432,b:5433/pc?target_session_attrs=read-write",
            "postgresql://a:5432,b:5433/pc",
        ),
        ("postgresql://pitcrew@a,b/pc", "postgresql://a:5432,b:5432/pc"),
        ("host=a,b port=6432 dbname=pc user=pitcrew", "postgresql://a:6432,b:6432/pc"),
        ("postgresql://app@cluster-rw.db:5432/app", "postgresql://cluster-rw.db:5432/app"),
    ],
)
def test_where_names_every_server_and_the_database_only(url: str, shown: str) -> None:
    assert where(url) == shown


@pytest.mark.parametrize(
    ("commit", "names", "standbys", "mode"),
    [
        ("on", "", 0, "none"),  # a single server (or storage replicated below Postgres)
        ("on", "*", 0, "none"),  # named, none streaming: commits wait, none is lost to a failover
        ("on", "", 1, "asynchronous"),  # CloudNativePG's default: replicas, none synchronous
        ("on", "ANY 1 (pg-2, pg-3)", 2, "synchronous"),
        ("remote_write", "FIRST 1 (s1)", 1, "synchronous"),
        ("remote_apply", "*", 1, "synchronous"),
        ("local", "*", 1, "asynchronous"),  # this session does not wait for the standby
        ("off", "*", 2, "asynchronous"),
        ("on", "  ", 1, "asynchronous"),
    ],
)
def test_replication_is_synchronous_only_where_a_commit_waits_for_a_standby(
    commit: str, names: str, standbys: int, mode: str
) -> None:
    seen = Replication.of(commit, names, standbys)
    assert (seen.mode, seen.standbys, seen.commit) == (mode, standbys, commit)


@pytest.mark.parametrize(
    ("commit", "names", "standbys", "said"),
    [
        ("on", "", 0, "no standby streams from it"),
        ("on", "*", 1, "1 standby(s), commits wait for a synchronous one"),
        ("on", "", 2, "2 standby(s), asynchronous: a failover may lose what pitcrew acknowledged"),
        (
            "off",
            "",
            0,
            "no standby streams from it; synchronous_commit off: a commit returns before it is on disk",
        ),
        ("off", "*", 1, "asynchronous: a failover may lose"),
    ],
)
def test_how_the_server_keeps_what_pitcrew_acknowledged_is_said(
    commit: str, names: str, standbys: int, said: str
) -> None:
    assert said in Replication.of(commit, names, standbys).said()
    assert ("synchronous_commit off" in Replication.of(commit, names, standbys).said()) == (commit == "off")
