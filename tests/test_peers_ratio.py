"""The peer benchmark's arithmetic on synthetic timings: paired ratios, like-with-like rounds,
the workload's options and the pfl driver's model (no pfl-research, nothing timed)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fedul_flwr.experiments import peers_stats
from fedul_flwr.experiments.peers_stats import paired_ratio, rounds_without_evaluation, summarize, timed_pairs
from fedul_flwr.experiments.peers_workload import PeersWorkload, add_workload_arguments, engine_settings, resolve_workload


def _drifting(n: int, speedup: float, start: float = 1.0, step: float = 0.5) -> tuple[list[float], list[float]]:
    """pfl and engine timings under load that doubles and more over the phase: each engine
    round ``speedup`` times faster than the pfl iteration right before it."""
    load = [start + step * i for i in range(n)]
    return [4.0 * x for x in load], [4.0 * x / speedup for x in load]


def test_paired_ratio_recovers_the_speedup_under_drifting_load_where_pooled_medians_do_not() -> None:
    pfl, engine = _drifting(12, speedup=9.65)
    pairs = timed_pairs(pfl, engine, warm=2)
    assert paired_ratio(pairs) == pytest.approx(9.65)
    # pfl pooled over another, later phase (heavier load) against this phase's engine median: not 9.65
    later_pfl, _ = _drifting(12, speedup=9.65, start=7.0)
    pooled = peers_stats.median(pfl[2:] + later_pfl[2:]) / peers_stats.median(engine[2:])
    assert abs(pooled - 9.65) > 1.0


def test_timed_pairs_drop_pfls_iteration_of_the_untimed_last_round() -> None:
    pfl = [10.0, 11.0, 12.0, 13.0, 99.0]  # 5 iterations: one before each of 5 engine rounds
    engine = [1.0, 2.0, 3.0, 4.0]  # 4 timed: the 5th (final evaluation) has no time
    assert timed_pairs(pfl, engine, warm=1) == [(11.0, 2.0), (12.0, 3.0), (13.0, 4.0)]
    assert paired_ratio(timed_pairs(pfl, engine, warm=1)) == pytest.approx(4.0)  # 99 never counts
    assert timed_pairs(pfl[:4], engine, warm=0) == list(zip(pfl[:4], engine))  # as many: all paired
    with pytest.raises(ValueError, match="6 pfl iterations for 4 timed engine rounds"):
        timed_pairs([*pfl, 1.0], engine, warm=0)
    with pytest.raises(ValueError, match="positive and finite"):
        paired_ratio([(1.0, 0.0)])
    assert paired_ratio([]) != paired_ratio([])  # NaN without pairs


def test_rounds_without_evaluation_leave_out_the_first_and_every_evaluated_round() -> None:
    round_s = [17.2, 6.5, 6.4, 6.3, 6.4, 16.0]  # Ray, 6 rounds, final evaluation in round 6
    assert rounds_without_evaluation(round_s, evaluate_every=6) == [6.5, 6.4, 6.3, 6.4]
    assert rounds_without_evaluation(list(range(1, 11)), evaluate_every=3) == [2, 4, 5, 7, 8]  # 3, 6, 9, 10 evaluate
    assert rounds_without_evaluation([5.0, 1.0, 9.0], evaluate_every=100, skip_first=0) == [5.0, 1.0]
    with pytest.raises(ValueError, match="evaluate-every=0"):
        rounds_without_evaluation(round_s, 0)


def test_summary_pairs_each_phase_with_its_own_pfl_iterations() -> None:
    warm = 2

    def phase(speedup: float, start: float) -> dict:
        pfl, engine = _drifting(13, speedup, start=start)
        return {"round-s": engine[:12], "pfl-round-s": pfl, "call-s": [[0.1] * 5] * 13, "train-s": [[0.08] * 5] * 13,
                "clients-at-once": 1}  # fmt: skip

    entry = {"engine": phase(2.0, 1.0), "engine-fedul": phase(1.5, 5.0), "ray": {"median-s": 3.0}}
    s = summarize(entry, warm)
    assert s["pfl-over-engine"] == pytest.approx(2.0) and s["pfl-over-engine-fedul"] == pytest.approx(1.5)
    assert s["pairs"] == 10
    assert s["engine-s"] == pytest.approx(peers_stats.median(entry["engine"]["round-s"][warm:]))
    assert s["ray-over-engine"] == pytest.approx(3.0 / s["engine-s"])
    # the breakdown counts the timed rounds only (10 of the 13 rounds' calls)
    assert s["breakdown"]["server-s-per-round"] == pytest.approx(s["engine-s"] - 0.5)


def _args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_workload_arguments(p)
    return p.parse_args(argv)


def test_the_default_workload_is_pfl_researchs_cifar10_benchmark() -> None:
    w = resolve_workload(_args([]))
    assert w == PeersWorkload()
    settings = engine_settings(w, "")
    assert (w.model, w.users, w.cohort, w.batch_size, w.local_epochs, w.lr) == ("simple-cnn", 1000, 50, 10, 1, 0.1)
    assert settings["fraction-train"] == 0.05 and "samples-per-client" not in settings


def test_a_typed_flag_wins_over_the_workload_file(tmp_path: Path) -> None:
    path = tmp_path / "w.yaml"
    path.write_text("model: small-cnn\nusers: 700\ncohort: 30\nimages-per-user: 40\nlr: 0.05\n")
    w = resolve_workload(_args(["--peers-workload", str(path), "--peers-cohort", "21", "--peers-batch-size", "32"]))
    assert (w.model, w.users, w.cohort, w.images_per_user, w.batch_size, w.lr) == ("small-cnn", 700, 21, 40, 32, 0.05)
    settings = engine_settings(w, "")
    assert int(700 * settings["fraction-train"]) == 21  # Flower's FedAvg samples exactly the cohort
    assert settings["samples-per-client"] == 40 and settings["batch-size"] == 32


@pytest.mark.parametrize(("text", "message"), [
    ("model: small-cnn\ncohrt: 3\n", "unknown key 'cohrt'"),
    ("users: ten\n", "users='ten': expected an integer"),
    ("- 1\n", "expected a mapping"),
    ("users: 10\ncohort: 20\n", "cohort=20 above users=10"),
    ("lr: -1\n", "lr=-1.0: expected a positive number"),
])  # fmt: skip
def test_a_bad_workload_file_is_refused_in_one_line_naming_the_key(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "w.yaml"
    path.write_text(text)
    with pytest.raises(SystemExit, match=message):
        resolve_workload(_args(["--peers-workload", str(path)]))


def test_pfl_drivers_torchscript_model_gives_the_engines_logits(tmp_path: Path) -> None:
    """A model other than simple-cnn reaches pfl's driver as TorchScript, which the driver
    (a torch-only process) loads and trains as a plain module."""
    from fedul_flwr.models import build_model

    model = build_model("paper-cnn", 3, 10, 32).eval()  # TorchScript takes it (small-cnn's pooling it does not)
    torch.jit.save(torch.jit.script(model), str(tmp_path / "m.pt"))
    x = torch.randn(4, 3, 32, 32)
    with torch.no_grad():
        expected = model(x)
    torch.save(x, tmp_path / "x.pt")
    code = ("import json, sys, torch; sys.path.insert(0, sys.argv[1]); import pfl_driver as d; "
            "m = d.build_model({'model': 'torchscript', 'initial': sys.argv[2]}, 3, 10, 32).eval(); "
            "assert 'fedul_flwr' not in sys.modules; "
            "print(json.dumps([m(torch.load(sys.argv[3])).tolist(), len(list(m.parameters()))]))")  # fmt: skip
    driver_dir = Path(__file__).resolve().parents[1] / "fedul_flwr" / "experiments"
    out = subprocess.run([sys.executable, "-c", code, str(driver_dir), str(tmp_path / "m.pt"), str(tmp_path / "x.pt")],
                         capture_output=True, text=True, check=True)  # fmt: skip
    logits, params = json.loads(out.stdout)
    assert torch.allclose(torch.tensor(logits), expected, atol=1e-5)
    assert params == len(list(model.parameters()))
