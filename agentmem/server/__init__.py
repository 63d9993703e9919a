"""agentmem as a service: REST, OpenAI-compatible chat with memories mounted as KV, MCP, inspector, metrics.

Needs the ``server`` extra (``pip install "agentmem[server]"``). Built on agentmem's public API only.

Example:
    >>> from agentmem import AgentMemory
    >>> from agentmem.server import KeyStore, ServerSettings, create_app
    >>> app = create_app(AgentMemory("./memdata"), keys=KeyStore("./memdata"), settings=ServerSettings())
"""

from agentmem.server.app import create_app
from agentmem.server.auth import KeyStore, Principal
from agentmem.server.state import ServerSettings

__all__ = ["KeyStore", "Principal", "ServerSettings", "create_app"]
