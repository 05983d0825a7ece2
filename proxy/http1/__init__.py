"""The proxy's HTTP/1.1 protocol under uvicorn's server (`http=` of its config): the parser's
callbacks (`_protocol`), each request's ASGI cycle (`_cycle`), and what sits between them and
the socket (`_transport`)."""

from proxy.http1._protocol import OneWriteHttpToolsProtocol

__all__ = ["OneWriteHttpToolsProtocol"]
