"""Flower entry point (``[tool.flwr.app.components] clientapp``): the package's ClientApp."""

from fedul_flwr.client_app import app

__all__ = ["app"]
