"""``quickdraft serve``: an OpenAI-compatible HTTP server over the engine (``create_app``), with
the playground page at ``/`` and requests that name their method (``OtherMethods``)."""

from quickdraft.server.app import ServerConfig, create_app
from quickdraft.server.pool import MethodOption, OtherMethods

__all__ = ["MethodOption", "OtherMethods", "ServerConfig", "create_app"]
