"""Names of the records and keys that travel between the ServerApp and the ClientApps.

One module for every name both sides must agree on, so that client and server code never
spell a key twice. Flower's own names (``"arrays"``, ``"metrics"``, ``"config"``, FedProx's
``"proximal-mu"``) are repeated here because our code reads them too.

Train message (server -> client), a :class:`~flwr.app.RecordDict`:

- ``"arrays"`` (ArrayRecord): every exchanged model of the method, keyed
  ``"<model name>.<parameter>"`` (the state dict of an ``nn.ModuleDict`` of those models);
- ``"config"`` (ConfigRecord): ``"server-round"``, ``"run-config"`` (the resolved settings of
  the run as JSON: the server resolves them once, the clients use them as they are), and the
  strategy's own keys (``"proximal-mu"``, ``"scaffold-option"``);
- ``"server-cv"`` (ArrayRecord, SCAFFOLD only): the server control variate;
- ``"optimizer-state"`` (ArrayRecord, ``local-optimizer-state = "kept"``, from the client's
  second round on): the client's local optimiser state (:mod:`fedul_flwr.optimizer_state`).

Train reply (client -> server):

- ``"arrays"``: the exchanged models the client trained (a method may send only some);
- ``"metrics"`` (MetricRecord): ``"train-loss"``, ``"num-examples"``, ``"uniform-weight"``,
  ``"num-steps"``, the strategy's metrics and the method's uploads (scalars or K-vectors);
- ``"node"`` (ConfigRecord): ``"node-key"``, the node's stable key (the aggregation order);
- ``"cv-delta"`` (ArrayRecord, SCAFFOLD only);
- ``"optimizer-state"`` (ArrayRecord, ``local-optimizer-state = "kept"``): its new state.

Query reply (client -> server): ``"metrics"`` (the method's announcement) and ``"node"``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

ARRAYS = "arrays"
METRICS = "metrics"
CONFIG = "config"

# train / evaluate config keys
SERVER_ROUND = "server-round"
RUN_CONFIG = "run-config"
DATASET_FACTS = "dataset-facts"  # the run's DatasetInfo as JSON: what a deployed node's folder must match
RUN_SETTINGS = (RUN_CONFIG, DATASET_FACTS)  # what every message to a node carries (a method's own messages too)
PROXIMAL_MU = "proximal-mu"  # set by Flower's FedProx
SCAFFOLD_OPTION = "scaffold-option"

# reply metrics every client sends
TRAIN_LOSS = "train-loss"
NUM_EXAMPLES = "num-examples"
UNIFORM_WEIGHT = "uniform-weight"
NUM_STEPS = "num-steps"
CV_ROUNDS = "scaffold-cv-rounds"  # rounds this node's SCAFFOLD c_i was updated in

# server metrics of a DP run: the privacy spent after a round and in one round (fedul_flwr.privacy.accounting.privacy_spent)
PRIVACY_EPSILON = "privacy-epsilon"
PRIVACY_EPSILON_ROUND = "privacy-epsilon-round"  # the exact epsilon of one round's release
PRIVACY_DELTA = "privacy-delta"
PRIVACY_CLIPPING_NORM = "privacy-clipping-norm"  # server-adaptive: the C this round's updates were clipped to

# aggregation weights (run setting ``aggregation-weights``) -> reply metric
WEIGHT_KEYS = {"num-examples": NUM_EXAMPLES, "uniform": UNIFORM_WEIGHT}

# node identity of a reply
NODE_RECORD = "node"
NODE_KEY = "node-key"

# the kept local optimiser state (train message and reply)
OPTIMIZER_STATE = "optimizer-state"

# SCAFFOLD records
SERVER_CV = "server-cv"
CV_DELTA = "cv-delta"

# context.state entries of a node
CLIENT_CV_STATE = "scaffold-client-cv"
KEPT_MODEL_STATE = "kept-model."  # + model name: a model the method keeps on the node


def model_prefix(model: str) -> str:
    """The key prefix of ``model``'s arrays in an ArrayRecord (``"f."`` for model ``f``)."""
    return f"{model}."


def model_of(key: str) -> str:
    """The model name an array key belongs to (``"f.features.0.weight"`` -> ``"f"``)."""
    return key.split(".", 1)[0]


_DECODE_LOCK = threading.Lock()


@contextmanager
def decoding() -> Iterator[None]:
    """Decode received arrays (``ArrayRecord.to_torch_state_dict``, ``Array.numpy``) inside this
    block: one thread of the process at a time. numpy reads each array's header with
    ``ast.literal_eval``, and CPython 3.11's AST constructor is not thread-safe: two clients of
    the in-process engine's parallel cohort decoding at once failed a round with ``SystemError:
    AST constructor recursion depth mismatch``. Decoding is a copy, short beside a client's
    training."""
    with _DECODE_LOCK:
        yield
