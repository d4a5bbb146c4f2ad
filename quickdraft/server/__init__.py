"""``quickdraft serve``: an OpenAI-compatible HTTP server over the engine (``create_app``)."""

from quickdraft.server.app import ServerConfig, create_app

__all__ = ["ServerConfig", "create_app"]
