"""HASSLE's faster round: the frozen teachers run once per round (not inside every residual
step), in the loop's memory format and in float32; the central evaluation reuses the logits of
a model whose weights have not changed since the last round; and the round gives the numbers
the code before these changes gave (the baseline git revision, run beside this checkout)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch
from torch import nn

from fedul_flwr.preflight import resolve_config
from fedul_flwr.data import simulated
from fedul_flwr.methods.base import RoundContext, method_class
from fedul_flwr.models import SmallCNN, build_model
from fedul_flwr.training import LocalLoop


@contextmanager
def _forwards() -> Iterator[list[tuple[int, bool, bool, torch.dtype]]]:
    """Every forward of a small CNN while inside: (its conv1 width, with gradient, NHWC input, output dtype)."""
    calls: list[tuple[int, bool, bool, torch.dtype]] = []

    def hook(module: nn.Module, args: tuple, output: torch.Tensor) -> None:
        if isinstance(module, SmallCNN):
            x = args[0]
            calls.append((module.features[0].out_channels, torch.is_grad_enabled(),
                          x.is_contiguous(memory_format=torch.channels_last), output.dtype))  # fmt: skip

    handle = nn.modules.module.register_module_forward_hook(hook)
    try:
        yield calls
    finally:
        handle.remove()


def test_teachers_run_once_per_round_in_float32_and_the_loops_layout() -> None:
    """A partially labeled client: Eq. 11's teacher (w_S_prev + r_US) on its unlabeled images,
    and each residual's base and target on its data, each in one pass of at most 512 images
    -- not once per training step -- in float32 on NHWC inputs (the loop runs channels-last
    here); the trained models' forwards are the steps' own."""
    cfg = resolve_config({"method": "hassle", "client-setting": "annotation-heterogeneity", "label-layout": "P,P,U",
                          "labeled-share": 0.5, "samples-per-client": 300, "batch-size": 32,
                          "memory-format": "channels-last", "precision": "bf16"})  # fmt: skip
    hassle = method_class("hassle")(cfg)
    client = simulated.load_client(cfg, 0, 3, frozenset({"labeled", "unlabeled"}))
    n_l, n_u = len(client.labeled), len(client.unlabeled)
    assert n_l > 32 and n_u > 32
    models = nn.ModuleDict({s.name: build_model("small-cnn", 1, 10, 28, seed=i, width=s.width)
                            for i, s in enumerate(hassle.model_specs())})  # fmt: skip
    from fedul_flwr.execution import loop_acceleration

    acc = loop_acceleration(cfg, torch.device("cpu"))
    loop = LocalLoop(epochs=1, lr=0.01, l1_weight=0.0, optimizer="sgd", seed=0, device=torch.device("cpu"),
                     to_input=client.to_input, acceleration=acc)  # fmt: skip
    from fedul_flwr.methods.hassle import TEACHER_LOGITS

    TEACHER_LOGITS.clear()  # another test's round on these weights and images would be read back
    with _forwards() as calls:
        result = hassle.local_update(client, models, RoundContext(0, 1, 0), loop)
    teachers = [c for c in calls if not c[1]]
    steps = [c for c in calls if c[1]]
    # Eq. 11: w_S_prev (20 channels) and r_US (5); r_US's base w_S and target w_U on the labeled
    # images; r_SU's base w_U and target w_S on the unlabeled ones: one pass each (< 512 images)
    assert sorted(c[0] for c in teachers) == [5, 20, 20, 20, 20, 20]
    assert all(nhwc and dtype == torch.float32 for _, _, nhwc, dtype in teachers)
    assert len(steps) == result.num_steps  # one trained forward per step, nothing else
    assert all(nhwc and dtype == torch.bfloat16 for _, _, nhwc, dtype in steps)


def test_a_client_of_the_last_round_reads_back_f_u_w_s_prev_with_the_same_numbers() -> None:
    """Round t computes f(u; w_S^(t)) (r_SU's target); in round t+1 w_S_prev is w_S^(t), so
    Eq. 11 runs w_S_prev no more on that client's unlabeled images, and the round trains the
    very weights it trains with nothing kept; other images or weights are run."""
    import copy

    from fedul_flwr.methods.hassle import TEACHER_LOGITS

    cfg = resolve_config({"method": "hassle", "client-setting": "annotation-heterogeneity", "label-layout": "P,P,U",
                          "labeled-share": 0.5, "samples-per-client": 200, "batch-size": 64})  # fmt: skip
    hassle = method_class("hassle")(cfg)
    client = simulated.load_client(cfg, 0, 3, frozenset({"labeled", "unlabeled"}))
    received = nn.ModuleDict({s.name: build_model("small-cnn", 1, 10, 28, seed=i, width=s.width)
                              for i, s in enumerate(hassle.model_specs())})  # fmt: skip
    loop = LocalLoop(epochs=1, lr=0.01, l1_weight=0.0, optimizer="sgd", seed=0, device=torch.device("cpu"),
                     to_input=client.to_input)  # fmt: skip
    TEACHER_LOGITS.clear()
    hassle.local_update(client, copy.deepcopy(received), RoundContext(0, 1, 0), loop)  # round 1 on w_S^(1)
    second = copy.deepcopy(received)  # round 2: w_S_prev <- w_S^(1), w_S and w_U move on
    second["w_S_prev"].load_state_dict(received["w_S"].state_dict())
    for name in ("w_S", "w_U"):
        with torch.no_grad():
            second[name].classifier[-1].bias.add_(0.1)

    def round_two() -> tuple[nn.ModuleDict, list[int]]:
        models = copy.deepcopy(second)
        with _forwards() as calls:
            hassle.local_update(client, models, RoundContext(0, 2, 0), loop)
        return models, sorted(c[0] for c in calls if not c[1])

    hits = TEACHER_LOGITS.hits
    cached, teachers = round_two()
    assert TEACHER_LOGITS.hits == hits + 1
    assert teachers == [5, 20, 20, 20, 20]  # w_S_prev's pass on the unlabeled images is read back
    TEACHER_LOGITS.clear()
    plain, teachers = round_two()
    assert teachers == [5, 20, 20, 20, 20, 20]
    for name in cached:
        for (k, a), b in zip(cached[name].state_dict().items(), plain[name].state_dict().values(), strict=True):
            assert torch.equal(a, b), f"{name}.{k}"
    other = simulated.load_client(cfg, 2, 3, frozenset({"labeled", "unlabeled"}))  # other images: run
    TEACHER_LOGITS.clear()
    hassle.local_update(client, copy.deepcopy(received), RoundContext(0, 1, 0), loop)
    hits = TEACHER_LOGITS.hits
    hassle.local_update(other, copy.deepcopy(second), RoundContext(0, 2, 0), loop)
    assert TEACHER_LOGITS.hits == hits


def test_the_evaluation_reuses_the_logits_of_unchanged_weights() -> None:
    """With an :class:`EvaluationCache`, a model whose weights equal those of a model run in
    the previous call (the same model, or another name: HASSLE's w_S_prev is the last round's
    w_S) runs no forward pass, and every number is the one a forward pass gives."""
    from fedul_flwr.evaluation import EvaluationCache, evaluate_predictors

    models = nn.ModuleDict({"a": build_model("small-cnn", 1, 10, 28, seed=0), "b": build_model("small-cnn", 1, 10, 28, seed=1)})
    predictors = {"a": lambda m, x: m["a"](x), "b": lambda m, x: m["b"](x), "sum": lambda m, x: m["a"](x) + m["b"](x)}
    g = torch.Generator().manual_seed(0)
    x, y = torch.randint(0, 256, (300, 1, 28, 28), dtype=torch.uint8, generator=g), torch.randint(0, 10, (300,), generator=g)
    to_input = lambda v: v.float() / 255  # noqa: E731
    cache = EvaluationCache()
    first = evaluate_predictors(models, predictors, x, y, to_input=to_input, batch_size=128, cache=cache)
    models["b"].load_state_dict(models["a"].state_dict())  # b now holds a's previous weights
    with torch.no_grad():
        models["a"].classifier[-1].bias.add_(1.0)  # a changes
    with _forwards() as calls:
        second = evaluate_predictors(models, predictors, x, y, to_input=to_input, batch_size=128, cache=cache)
    assert len(calls) == 3  # a's three batches; b's logits are a's of the first call
    assert cache.hits == 1
    plain = evaluate_predictors(models, predictors, x, y, to_input=to_input, batch_size=128)
    assert second == plain
    assert second["b"] == first["a"]
    with _forwards() as calls:  # nothing changed: no forward at all, the same numbers
        assert evaluate_predictors(models, predictors, x, y, to_input=to_input, batch_size=128, cache=cache) == plain
    assert calls == []


def _has_revision(revision: str) -> bool:
    from fedul_flwr.experiments.hassle_bench import PROJECT

    try:
        found = subprocess.run(["git", "-C", str(PROJECT), "cat-file", "-e", f"{revision}^{{commit}}"], capture_output=True)
    except FileNotFoundError:
        return False
    return found.returncode == 0


@pytest.mark.slow
def test_the_faster_round_gives_the_numbers_of_the_baseline_revision(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Three rounds of HASSLE on three clients (fully, partially and un-labeled, embedded
    ``mnist-sample``), run by the package with the faster round and by the package at the baseline
    revision: the same test accuracies, losses and final weights up to float32 rounding (the
    teachers' kernels differ in layout and batch size). The faster side is the last revision
    with the baseline's seed streams (``LAST_OLD_STREAMS_REVISION``): since then the streams that
    could meet another are keyed, which moves the data and the second model's weights."""
    from fedul_flwr.experiments.hassle_bench import BASELINE_REVISION, LAST_OLD_STREAMS_REVISION, differences, run_pair

    for revision in (BASELINE_REVISION, LAST_OLD_STREAMS_REVISION):
        if not _has_revision(revision):
            pytest.skip(f"needs the git history with {revision[:8]} (a source checkout)")
    run_config = {"method": "hassle", "client-setting": "annotation-heterogeneity", "label-layout": "L,P,U",
                  "labeled-share": 0.5, "samples-per-client": 300, "batch-size": 32, "min-available-nodes": 3,
                  "min-train-nodes": 3, "num-rounds": 3, "client-threads": 1}  # fmt: skip
    pair = run_pair(run_config, BASELINE_REVISION, num_nodes=3, gate=False, workdir=tmp_path,
                    current=LAST_OLD_STREAMS_REVISION)
    assert [r["round"] for r in pair["metrics"]["current"]] == [0, 1, 2, 3]
    diff = differences(pair)
    assert diff["accuracy"] <= 1e-3 and diff["loss"] <= 1e-4 and diff["weights"] <= 1e-3, diff


def test_hassle_section_renders_each_sides_rounds_medians_and_the_speedup() -> None:
    """``--markdown`` of the ``hassle`` section (the committed results): one row per side with
    its seconds per round and median, the ratio of the medians and the differences."""
    import json
    from pathlib import Path

    from fedul_flwr.experiments.benchmark import render_markdown
    from fedul_flwr.experiments.tables import table_rows

    results = json.loads((Path(__file__).parent.parent / "docs" / "benchmarks" / "hassle.json").read_text())
    section = results["hassle"]
    section["median-s"]["current"], section["speedup"] = 12.345, 2.3456
    text = render_markdown(results)
    rows = {row[0]: row for row in table_rows(text) if row[0] in ("this checkout", f"`{section['setting']['baseline'][:8]}` (before)")}
    assert len(rows) == 2
    assert rows["this checkout"][-1] == "**12.35**"
    assert len(rows["this checkout"]) == len(section["round-s"]["current"]) + 2
    assert "**2.35x**" in text
