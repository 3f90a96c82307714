"""The Lua scripts of ``outbox/queue/lua/``, loaded once per process.

Each script is ``_common.lua`` (the key layout and shared helpers) followed by
its own file; the lock scripts take only the lock key and stand alone.
"""

from __future__ import annotations

from functools import cache
from importlib import resources

from redis.commands.core import Script


@cache
def shared_script(name: str) -> Script:
    """One Script per process: its source is read and its SHA1 computed once.

    It is always called with the queue's own client (``client=``), so one
    object serves every connection.
    """
    return Script(None, _script_source(name).encode())  # type: ignore[arg-type]


@cache
def _script_source(name: str) -> str:
    lua = resources.files("outbox.queue").joinpath("lua")
    body = lua.joinpath(f"{name}.lua").read_text(encoding="utf-8")
    if name.startswith("lock_"):
        return body  # lock scripts take only the lock key
    return lua.joinpath("_common.lua").read_text(encoding="utf-8") + "\n" + body
