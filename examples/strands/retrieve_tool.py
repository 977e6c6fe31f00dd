"""The ``local_search`` Strands tool, bound to the retrieval server at ``$RETRIEVAL_SERVER_URL``.

Start a server first (``bash rag/launch_rag.sh`` serves the HotpotQA demo index on
http://127.0.0.1:8000), then give ``local_search`` to an agent (from this directory, or build
your own with ``rag.client.make_local_search_tool(url)``):

    from retrieve_tool import local_search
    agent = Agent(model=..., tools=[local_search])

``RETRIEVAL_SERVER_URL`` (default ``http://127.0.0.1:8000``) and ``RETRIEVAL_TOKEN`` are read at
import. Run this file to check the server and try a query:

    python examples/strands/retrieve_tool.py "Which magazine was started first?"
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

from rag.client import RetrievalClient, check_health, format_passages, make_local_search_tool
from rag.errors import RetrievalError

RETRIEVAL_SERVER_URL = os.environ.get("RETRIEVAL_SERVER_URL", "http://127.0.0.1:8000")
RETRIEVAL_TOKEN = os.environ.get("RETRIEVAL_TOKEN") or None  # the variable rag/launch_rag.sh reads too

local_search = make_local_search_tool(RETRIEVAL_SERVER_URL, RETRIEVAL_TOKEN)


async def health(url: str = RETRIEVAL_SERVER_URL, token: str | None = RETRIEVAL_TOKEN) -> dict:
    """The server's ``/health``; raises ``RetrievalError`` with a readable reason when it is down."""
    return await check_health(url, token)


async def _main(query: str) -> int:
    try:
        info = await health()
    except RetrievalError as e:
        print(f"retrieval server not ready: {e}\nstart one with: bash rag/launch_rag.sh", file=sys.stderr)
        return 1
    print(f"{RETRIEVAL_SERVER_URL}: {info['corpus_size']} passages, encoder {info['encoder']['name']}")
    client = RetrievalClient(RETRIEVAL_SERVER_URL, RETRIEVAL_TOKEN)
    print(format_passages(await client.search(query, 3)))
    await client.aclose()
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Check the retrieval server at $RETRIEVAL_SERVER_URL "
                                     f"(now {RETRIEVAL_SERVER_URL}) and print the top 3 passages for a query.")
    parser.add_argument("query", nargs="*", help="the query (default: 'Who directed the film Krull?')")
    sys.exit(asyncio.run(_main(" ".join(parser.parse_args().query) or "Who directed the film Krull?")))
