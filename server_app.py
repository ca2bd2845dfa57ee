"""Flower entry point (``[tool.flwr.app.components] serverapp``): the package's ServerApp."""

from fedul_flwr.server_app import app

__all__ = ["app"]
