"""Experiments: the reproduction grids, the strategy comparison and the benchmarks, run by the
``fedul`` command (:mod:`fedul_flwr.cli`) through one grid runner (:mod:`.runner`)."""
