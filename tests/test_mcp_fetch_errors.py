"""MCP fetch of a page it cannot read (issue 43): the error echoes the client's id on one line,
cut short, never a megabyte of it back."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("mcp")
from mcp.server.mcpserver.exceptions import ToolError  # noqa: E402

from drvenus import protocol  # noqa: E402
from drvenus.serve.mcp_server import _fetch  # noqa: E402


class Unreadable:
    async def read_text(self, url: str):
        return None


class Pool:
    async def toolbox(self):
        return SimpleNamespace(tools={protocol.VISIT: Unreadable()})


@settings(max_examples=30, deadline=None)
@given(url=st.text(min_size=1, max_size=3000).filter(str.strip), times=st.integers(1, 400))
def test_an_unreadable_page_echoes_its_id_cut_short(url, times):
    registry = SimpleNamespace(pool=Pool())
    long_id = url * times
    with pytest.raises(ToolError) as info:
        asyncio.run(_fetch(registry, long_id))  # type: ignore[arg-type]
    message = str(info.value)
    assert message.startswith("could not read ")
    assert len(message) <= len("could not read ") + 200 and "\n" not in message
