"""Everything a run sends is declared: each method's real ClientApp trains a round (and
evaluates, and answers queries) on the embedded sample, every record key of every reply is
collected, and each must be declared in the contract (fedul_flwr.strategies.contract) for every
DP mode the checks accept for that method, as noised, server only, opt-in or public; a field a
mode refuses makes the checks refuse the run. The docs hold the generated table."""

from __future__ import annotations

from pathlib import Path

import pytest
from flwr.app import Message

from fedul_flwr.preflight import resolve_config
from fedul_flwr.client_app import app as client_app
from fedul_flwr.config import ConfigError
from fedul_flwr.inprocess import InProcessGrid
from fedul_flwr.methods import METHODS
from fedul_flwr.privacy.mechanism import DP_MODES
from fedul_flwr.server_app import run_federation
from fedul_flwr.strategies import UNNOISED_PREFIX, build_strategy, inner_strategy
from fedul_flwr.strategies.contract import Exposure, fields_table, recorded_field, reply_fields, train_metric_keys

REPO = Path(__file__).resolve().parent.parent
TINY = {"samples-per-client": 200, "num-rounds": 1, "client-test-fraction": 0.2, "val-fraction": 0.05}


class Recording(InProcessGrid):
    """The in-process federation, keeping every reply's (message type, record, key)."""

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.sent: set[tuple[str, str, str]] = set()

    def pull_messages(self, message_ids):  # type: ignore[no-untyped-def]
        replies = list(super().pull_messages(message_ids))
        for reply in replies:
            self._keep(reply)
        return replies

    def _keep(self, reply: Message) -> None:
        if reply.has_error():
            return
        kind = str(reply.metadata.message_type).split(".")[0]
        for name, record in reply.content.items():
            for key in record.keys():
                self.sent.add((kind, name, key))


def _declared(strategy: str, method: str, options: dict, mode: str) -> dict[tuple[str, str], Exposure]:
    return {(f.record, f.key): f.treatment(mode).exposure for f in reply_fields(strategy, method, options)}


CASES = [(m, {}) for m in sorted(METHODS.names())] + [("fedpu", {"fedpu-cross-client": True})]


@pytest.mark.parametrize(("method", "options"), CASES)
def test_every_field_a_method_sends_is_declared_for_every_mode_it_accepts(
    method: str, options: dict, tmp_path: Path, small_test_set: None
) -> None:
    rc = {**TINY, **options, "method": method, "output-dir": str(tmp_path), "run-name": method, "label-fraction": 0.5,
          "client-setting": METHODS.get(method).setting, "positive-classes": "5", "label-layout": "P,U"}  # fmt: skip
    grid = Recording(client_app, 2, rc)
    outputs = run_federation(grid, resolve_config(rc))
    sent = grid.sent
    recorded = {k for row in outputs.rows.values() for k in row}
    assert {"test-accuracy", "val-accuracy", "train-loss"} <= recorded
    assert any(kind == "train" and name == "arrays" for kind, name, _ in sent)
    assert any(kind == "evaluate" for kind, _, _ in sent)  # the evaluation replies were seen too
    # the reply door's reference (every mode, refused ones included): no undeclared key, none sent always missing
    cfg = resolve_config(rc)
    declared, always = train_metric_keys(cfg.strategy, method, cfg.as_dict())
    assert always <= {key for kind, name, key in sent if (kind, name) == ("train", "metrics")} <= declared, method
    for mode in DP_MODES[1:]:
        try:
            cfg = resolve_config({**rc, "differential-privacy": mode, "dp-noise-multiplier": 0.5})
        except ConfigError:
            continue  # refused before round 1: nothing is sent
        declared = _declared(cfg.strategy, method, cfg.as_dict(), mode)
        for kind, name, key in sorted(sent):
            exposure = declared.get((f"{kind}:{name}", key), declared.get((f"{kind}:{name}", "*")))
            assert exposure is not None, f"{method} under {mode}: {kind} reply field {name}/{key} is not declared"
            assert exposure is not Exposure.REFUSED, f"{method} under {mode} accepted, yet it sends refused {name}/{key}"
        for key in sorted(recorded):  # what the server records and prints
            field = recorded_field(cfg.strategy, method, key, cfg.as_dict())
            assert field is not None, f"{method} under {mode}: the record's {key!r} is not declared"
            assert field.treatment(mode).exposure is not Exposure.REFUSED, f"{method} under {mode} records refused {key}"


@pytest.mark.parametrize("mode", DP_MODES[1:])
def test_a_mode_refusing_a_declared_field_is_refused_before_round_one(mode: str) -> None:
    """FedDB's APP-U drives DMA's weights: every DP mode refuses feddb, in one line naming it."""
    with pytest.raises(ConfigError, match=rf"^differential-privacy='{mode}' with method='feddb': ") as refused:
        resolve_config({"method": "feddb", "differential-privacy": mode, "dp-noise-multiplier": 0.5})
    assert "\n" not in str(refused.value)


def test_docs_hold_the_fields_table() -> None:
    assert fields_table() in (REPO / "docs" / "privacy.md").read_text()


@pytest.mark.parametrize("mode", DP_MODES[1:])
@pytest.mark.parametrize("opt_in", [False, True])
def test_client_evaluation_under_dp_runs_only_when_opted_in_and_is_marked(mode: str, opt_in: bool) -> None:
    """The clients' evaluation on their private test splits is an unnoised aggregate that
    Flower prints each round: under DP it is not asked for, unless opted in, and then every key
    it prints starts with ``unnoised-``."""
    from flwr.app import ArrayRecord, ConfigRecord, MetricRecord, RecordDict

    cfg = resolve_config({"differential-privacy": mode, "client-test-fraction": 0.2, "dp-noise-multiplier": 0.5,
                          "dp-publish-unnoised-client-evaluation": opt_in, "min-available-nodes": 2})  # fmt: skip
    inner = inner_strategy(build_strategy(cfg, num_nodes=2))
    assert inner.fraction_evaluate == (1.0 if opt_in else 0.0)
    plain = inner_strategy(build_strategy(resolve_config({"client-test-fraction": 0.2, "min-available-nodes": 2}),
                                          num_nodes=2))  # fmt: skip
    assert plain.fraction_evaluate == 1.0 and plain.evaluation_prefix == ""
    if not opt_in:
        return
    grid = InProcessGrid(client_app, 2, {})
    asked = list(inner.configure_evaluate(1, ArrayRecord(), ConfigRecord(), grid))
    assert len(asked) == 2
    metrics = {"test-accuracy": 0.5, "uniform-weight": 1.0, "num-examples": 10}
    replies = [Message(RecordDict({"metrics": MetricRecord(metrics)}), reply_to=m) for m in asked]
    printed = inner.aggregate_evaluate(1, replies)
    assert printed is not None and f"{UNNOISED_PREFIX}test-accuracy" in printed
    assert all(key.startswith(UNNOISED_PREFIX) for key in printed)
