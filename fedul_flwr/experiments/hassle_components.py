"""What each of HASSLE's models contributes, read from a run's checkpoint.

HASSLE ("Federated Semi-Supervised Learning with Annotation Heterogeneity") reports three
predictors, SM = f(w_S^(t-1)) + f(r_{U-S}), UM = f(w_U^(t-1)) + f(r_{S-U}) and EM, their mean.
When a predictor falls behind a baseline, the per-round metrics do not say which part is
responsible: the dual model itself (changed by the proximity term, or by the pseudo-labels it
learns from), or the residual added at inference. This module loads the global models of a
run's checkpoint (``checkpoint.pt``, the round it was written after) and measures:

- the test accuracy of the run's predictors (SM, UM, EM: the same numbers as the run's
  metrics of that round) and of each dual model alone (``w_S``, ``w_U``; and ``w_S_prev``,
  ``w_U_prev``, the copies the residuals were trained against, under the paper's pairing);
- with residual models, the same-round sums ``w_S + r_US`` and ``w_U + r_SU`` (the other
  pairing: what the residual does to the newest dual model);
- the accuracy of the pseudo-labels of Eq. 11 (the teacher w_S^(t-1) + r_{U-S}, or w_S alone
  without residuals) on the unlabeled images of every client, against their true classes
  (simulation knows them), and of w_S alone on the same images;
- with residual models, how often SM predicts the class that each dual model it could
  imitate predicts (% of test images with the same argmax as ``w_S_prev`` and as
  ``w_U_prev``): Eq. 7 fits softmax(r_{U-S}) to softmax(f(w_U) - f(w_S)), so the sum
  f(w_S) + f(r_{U-S}) leans towards the unsupervised model's predictions.

:func:`components` measures one run; :func:`render_components` tabulates several.
"""

from __future__ import annotations

import argparse
import functools
import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch

from fedul_flwr.checkpoint import load_checkpoint
from fedul_flwr.preflight import resolve_config
from fedul_flwr.experiments.tables import markdown_table, table_rows
from fedul_flwr.data.image_dataset import normalize
from fedul_flwr.data.simulated import load_client, load_run_dataset
from fedul_flwr.methods import get_method
from fedul_flwr.methods.base import Predictor
from fedul_flwr.methods.hassle import _logits as hassle_logits
from fedul_flwr.server_app import global_models
from fedul_flwr.evaluation import evaluate_predictors
from fedul_flwr.store import write_atomic

__all__ = ["components", "render_components"]

PSEUDO_TEACHER, PSEUDO_W_S = "pseudo-labels (Eq. 11 teacher)", "pseudo-labels of w_S alone"
AGREE = {"w_S_prev": "SM agrees with w_S_prev", "w_U_prev": "SM agrees with w_U_prev"}
"""Column of the share of test images where SM's argmax equals that model's, by model."""


def _alone(name: str) -> Predictor:
    return lambda models, x: models[name](x)


def _sum(a: str, b: str) -> Predictor:
    return lambda models, x: models[a](x) + models[b](x)


def components(run_dir: str | Path, num_clients: int) -> dict[str, float]:
    """Test accuracy (%) of each predictor and model of a HASSLE run at its checkpoint, and
    the accuracy (%) of the pseudo-labels on the clients' unlabeled images (module doc).

    Parameters
    ----------
    run_dir : str | Path
        A run folder with ``config.json`` and ``checkpoint.pt`` (``method = "hassle"``, a
        simulated ``annotation-heterogeneity`` split whose dataset is reachable from the
        config's ``data-dir``).
    num_clients : int
        The run's number of simulated clients (its partitions).

    Returns
    -------
    dict[str, float]
        ``round`` (the checkpoint's), then accuracies in %: ``SM``, ``UM``, ``EM``, ``w_S``,
        ``w_U`` (and ``w_S_prev``, ``w_U_prev``, ``w_S + r_US``, ``w_U + r_SU`` where the run
        has them), :data:`PSEUDO_TEACHER` and :data:`PSEUDO_W_S`, and with residual models
        the agreements of :data:`AGREE` (% of test images).

    Raises
    ------
    ValueError
        If the run is not a HASSLE run.
    fedul_flwr.checkpoint.CheckpointError
        If the folder has no readable checkpoint.
    """
    run_dir = Path(run_dir)
    cfg = resolve_config(json.loads((run_dir / "config.json").read_text()))
    if cfg.method != "hassle":
        raise ValueError(f"{run_dir / 'config.json'}: method={cfg.method!r}, expected 'hassle'")
    checkpoint = load_checkpoint(run_dir)
    method = get_method(cfg.method)(cfg)
    data = load_run_dataset(cfg)
    models = global_models(cfg, method, data.in_channels, data.num_classes, data.image_size)
    models.load_state_dict({k: v.float() for k, v in checkpoint.state_dict.items()})
    models.eval()
    predictors: dict[str, Predictor] = dict(method.predictors())
    predictors.update({name: _alone(name) for name in ("w_S", "w_U", "w_S_prev", "w_U_prev") if name in models})
    if "r_US" in models:
        predictors.update({"w_S + r_US": _sum("w_S", "r_US"), "w_U + r_SU": _sum("w_U", "r_SU")})
    to_input = functools.partial(normalize, mean=data.mean, std=data.std)
    test = evaluate_predictors(models, predictors, data.test_x, data.test_y, to_input=to_input,
                               batch_size=cfg.eval_batch_size)  # fmt: skip
    out = {"round": float(checkpoint.round)}
    out.update({name: 100 * result["test-accuracy"] for name, result in test.items()})
    # Eq. 11's teacher, as a client builds it (Hassle.local_update), and w_S alone
    teachers = {PSEUDO_TEACHER: [models[method.paired("w_S")], models["r_US"]] if method.residual else [models["w_S"]],
                PSEUDO_W_S: [models["w_S"]]}  # fmt: skip
    correct = dict.fromkeys(teachers, 0)
    total = 0
    for pid in range(num_clients):
        client = load_client(cfg, pid, num_clients, frozenset({"labeled", "unlabeled"}))
        if client.unlabeled is None or not len(client.unlabeled):
            continue
        for name, modules in teachers.items():
            pred = hassle_logits(modules, client.unlabeled, client, torch.device("cpu"), cfg.eval_batch_size).argmax(1)
            correct[name] += int((pred == client.unlabeled_classes).sum())
        total += len(client.unlabeled)
    out.update({k: 100 * v / max(total, 1) for k, v in correct.items()})
    if method.residual and all(name in models for name in AGREE):
        same = dict.fromkeys(AGREE, 0)
        with torch.no_grad():
            for batch in torch.split(data.test_x, cfg.eval_batch_size):
                x = to_input(batch)
                sm = predictors["SM"](models, x).argmax(1)
                for name in AGREE:
                    same[name] += int((models[name](x).argmax(1) == sm).sum())
        out.update({column: 100 * same[name] / len(data.test_x) for name, column in AGREE.items()})
    return out


def render_components(rows: Mapping[str, Mapping[str, float]]) -> str:
    """Markdown table of :func:`components` results: one row per run (its label), one column
    per measured quantity (``-`` where a run lacks it).

    Parameters
    ----------
    rows : Mapping[str, Mapping[str, float]]
        Run label -> the dict :func:`components` returned.

    Returns
    -------
    str
        The table; empty without rows.
    """
    if not rows:
        return ""
    columns: list[str] = list(dict.fromkeys(k for r in rows.values() for k in r if k != "round"))
    cells = [[label, int(r["round"]), *("-" if r.get(c) is None else f"{r[c]:.2f}" for c in columns)]
             for label, r in rows.items()]  # fmt: skip
    return markdown_table(["run", "round", *columns], cells)


def read_components(page: str | Path) -> dict[str, dict[str, float]]:
    """The rows of a page :func:`main` wrote (the inverse of :func:`render_components`, to
    two decimals); empty when the file does not exist.

    Raises
    ------
    ValueError
        If the file has no components table between the snippet markers (names the file).
    """
    path = Path(page)
    if not path.is_file():
        return {}
    text = path.read_text()
    start, end = "<!-- --8<-- [start:components] -->", "<!-- --8<-- [end:components] -->"
    if start not in text or end not in text:
        raise ValueError(f"{path}: no components table between {start!r} and {end!r}")
    lines = table_rows(text[text.index(start) + len(start):text.index(end)])
    if not lines:
        return {}
    header = lines[0]
    rows: dict[str, dict[str, float]] = {}
    for cells in lines[1:]:
        rows[cells[0]] = {k: float(v) for k, v in zip(header[1:], cells[1:], strict=True) if v != "-"}
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m fedul_flwr.experiments.hassle_components RUN_DIR ... [--clients N] [--out FILE]``:
    measure each run folder and print the table, or write it to a page: the page keeps the
    rows of runs it already holds (a run folder is gone once its run is finished and
    recorded) and a run measured again replaces its row."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run_dirs", nargs="+", help="HASSLE run folders (config.json + checkpoint.pt)")
    p.add_argument("--clients", type=int, default=20, help="the runs' number of simulated clients (default: 20)")
    p.add_argument("--out", help="write the table to this page, keeping its rows of other runs (default: print it)")
    args = p.parse_args(argv)
    measured = {Path(d).name: components(d, args.clients) for d in args.run_dirs}
    if args.out:  # a page: a title, then the table between snippet markers (the docs include it by name)
        table = render_components({**read_components(args.out), **measured})
        title = "## HASSLE's models at each run's last checkpoint (% test accuracy; pseudo-labels: % right)"
        write_atomic(args.out, f"{title}\n\n<!-- --8<-- [start:components] -->\n{table}\n<!-- --8<-- [end:components] -->\n")
    else:
        print(render_components(measured))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
