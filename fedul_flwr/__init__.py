"""fedul-flwr: FedUL (Lu et al., ICLR 2022) -- federated learning from unlabeled sets with
known class priors -- as a Flower app (README.md; the documentation site is built from docs/)."""

import logging

__version__ = "0.1.0"


def get_logger(name: str) -> logging.Logger:
    """The logger of module ``name``, a child of Flower's ``flwr`` logger: the project's
    messages go through Flower's handlers, so they appear beside Flower's own lines (the
    console, ``flwr run --stream``, ``flwr log``; a deployed ClientApp's in its SuperNode's
    log) at Flower's level (INFO)."""
    return logging.getLogger(f"flwr.{name}")
