"""Which store a configuration selects: Postgres when ``store.url`` is set, else the SQLite file.

The Postgres driver is imported only when it is selected, so the embedded default needs nothing
beyond the standard library's ``sqlite3``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeAlias

from bot.config_sections import StoreSettings
from bot.store.sqlite import SqliteStore

if TYPE_CHECKING:
    from bot.store.postgres import PostgresStore

#: A store the composition root can route timeline events of (``route_events``) as well as use.
AnyStore: TypeAlias = "SqliteStore | PostgresStore"


def build_store(settings: StoreSettings) -> AnyStore:
    if settings.url is not None:
        from bot.store.postgres import PostgresStore

        return PostgresStore(settings.url, password_file=settings.password_file, retention=settings.retention)
    return SqliteStore(
        settings.path,
        synchronous=settings.synchronous,
        retention=settings.retention,
        network_filesystem=settings.allow_network_filesystem,
    )


def describe(settings: StoreSettings) -> str:
    """Where the store is, for people (no password: the URL never holds one)."""
    return settings.url if settings.url is not None else str(settings.path)
