"""A deployed node's data folder: its layout (:mod:`~fedul_flwr.data.node_folder.layout`), reading
and checking it (:mod:`~fedul_flwr.data.node_folder.reader`) and writing one
(:mod:`~fedul_flwr.data.node_folder.writer`). The command ``fedul node-data`` is
:mod:`fedul_flwr.node_data_cli`: it builds the clients of a run's setting, above the data layer.
"""
