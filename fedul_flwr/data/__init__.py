"""Datasets, partitions and the clients' data. Importing the package registers every dataset
source of :data:`fedul_flwr.data.datasets.DATASETS`, the ``hf:`` prefix of the user's own
datasets (:mod:`fedul_flwr.data.user_datasets`) included, so any import of a data module sees
the whole registry."""

from fedul_flwr.data import user_datasets as _user_datasets  # noqa: F401  (registers "hf:")
from fedul_flwr.data import synthetic as _synthetic  # noqa: F401,E402  (registers "synthetic-cifar")
