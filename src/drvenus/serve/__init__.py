"""Servers over the research agent: a web demo with a trace viewer, an OpenAI-compatible
endpoint and an MCP server, all on one run registry (``drvenus serve``, ``drvenus mcp``).

fastapi, uvicorn and mcp are optional: ``pip install 'drvenus[serve]'``. Nothing here is
imported by ``import drvenus``.
"""
