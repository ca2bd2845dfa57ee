"""fedul-flwr: FedUL (Lu et al., ICLR 2022) -- federated learning from unlabeled sets with
known class priors -- as a Flower app. See README.md."""

__version__ = "0.1.0"
