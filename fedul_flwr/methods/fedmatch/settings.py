"""The run-config keys FedMatch owns: defaults, rules, meaning.

The defaults: H = 2 helpers and tau = 0.85 from the paper (Jeong et al., ICLR 2021); the weights
lambda_s = 10, lambda_ICCS = 1e-2 (the code's lambda_i and lambda_a), lambda_L1 = 1e-4 and
lambda_L2 = 10 as the authors' code sets them for labels-at-clients (``config.py``); and the
code's psi = 0.2 sigma at first, the cut of psi's entries at or below 5e-6 before sending, and
helpers every 10th round. Where the code differs, its value is one switch away:
``fedmatch-threshold = 0.75`` (the code's confidence) and, in its labels-at-server
configuration, ``fedmatch-lambda-l1 = 1e-5`` and ``fedmatch-sparsity-threshold = 1e-5``. These
weights go with the authors' plain SGD at lr 1e-3; the presets rescale them to a longer step
(``presets/fedmatch.yaml``).
"""

from __future__ import annotations

from fedul_flwr.config import Option

__all__ = ["OPTIONS"]


OPTIONS: tuple[Option, ...] = (
    Option("fedmatch-helpers", 2, "helpers H per client: the clients whose models answer a fixed random input most like "
           "the client's own (inter-client consistency and agreement pseudo-labels); 0 turns the helpers off",
           check=lambda v: isinstance(v, int) and v >= 0, rule="an integer >= 0"),
    Option("fedmatch-helper-interval", 10, "the helpers travel in rounds t with t % interval == 0 only (the authors' "
           "code's h_interval); 1: every round",
           check=lambda v: isinstance(v, int) and v >= 1, rule="an integer >= 1"),
    Option("fedmatch-threshold", 0.85, "confidence threshold tau of the local prediction for an unlabeled image to "
           "count (the paper's 0.85; the authors' code: 0.75)",
           check=lambda v: 0.0 <= v <= 1.0, rule="in [0, 1]"),
    Option("fedmatch-lambda-s", 10.0, "weight lambda_s of the cross-entropy on labeled images (trains sigma)",
           check=lambda v: v > 0, rule="> 0"),
    Option("fedmatch-lambda-iccs", 0.01, "weight lambda_ICCS of the consistency terms on unlabeled images: the "
           "agreement pseudo-labels' cross-entropy and the KL divergence to the helpers (trains psi)",
           check=lambda v: v >= 0, rule=">= 0"),
    Option("fedmatch-lambda-l1", 1e-4, "weight lambda_L1 of the sparsity term, the sum of |psi| over every parameter "
           "(the authors' labels-at-server code: 1e-5)",
           check=lambda v: v >= 0, rule=">= 0"),
    Option("fedmatch-lambda-l2", 10.0, "weight lambda_L2 of the sum of (sigma - psi)^2 over every parameter, with "
           "sigma frozen",
           check=lambda v: v >= 0, rule=">= 0"),
    Option("fedmatch-psi-init", 0.2, "psi's initial parameters as this multiple of sigma's (the authors' code's "
           "psi_factor)",
           check=lambda v: v >= 0, rule=">= 0"),
    Option("fedmatch-sparsity-threshold", 5e-6, "psi entries with |value| at or below it are set to 0 before a client "
           "sends psi (the authors' code's l1_thres; labels-at-server: 1e-5); 0 keeps every entry",
           check=lambda v: v >= 0, rule=">= 0"),
)
