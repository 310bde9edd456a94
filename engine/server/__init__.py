"""The OpenAI-compatible HTTP server: `python -m engine serve`, and the app's "Serve on localhost".

An HTTP request is one more stream of the same Engine (its public submit/cancel with callbacks);
the engine thread keeps the GPU, the server's own thread and event loop keep the sockets.
"""
from .app import OpenAIServer
from .host import DEFAULT_HOST, DEFAULT_PORT, ServeError, ServerThread, check_bind, is_loopback
from .protocol import ApiError
from .slot import EngineSlot

__all__ = ["OpenAIServer", "ServerThread", "ServeError", "EngineSlot", "ApiError", "DEFAULT_HOST", "DEFAULT_PORT",
           "check_bind", "is_loopback"]
