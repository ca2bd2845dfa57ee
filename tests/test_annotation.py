"""The annotation-heterogeneity setting (fedul_flwr.data.annotation): layouts, the solved
label fraction of partially labeled clients, and the simulated clients."""

from __future__ import annotations

import numpy as np
import pytest

from fedul_flwr.preflight import resolve_config
from fedul_flwr.data import simulated
from fedul_flwr.data.annotation import label_fractions, labeled_rows, parse_layout


def test_named_layouts_kinds_and_fractions() -> None:
    assert parse_layout("ALL", 20, 0.1) == ["L"] + ["P"] * 9 + ["U"] * 10
    assert parse_layout("ALL", 20, 0.2) == ["L"] * 2 + ["P"] * 8 + ["U"] * 10
    assert parse_layout("LU", 20, 0.3) == ["L"] * 2 + ["U"] * 18
    assert parse_layout("L,P*2,U", 4, 0.1) == ["L", "P", "P", "U"]
    assert parse_layout("1, 0.25, 0", 3, 0.1) == [1.0, 0.25, 0.0]


@pytest.mark.parametrize(
    ("text", "clients", "share", "message"),
    [
        ("ALL", 20, 0.05, r"stated for labeled shares \[0.1, 0.2\], not 0.05"),
        ("ALL", 10, 0.1, "20 clients in the layout for 10 clients"),
        ("1,2", 2, 0.1, r"fractions \[2.0\] outside \[0, 1\]"),
        ("L,Q", 2, 0.1, "label-layout='L,Q': 'Q' is no kind"),
        ("LLUU", 4, 0.1, r"^label-layout='LLUU': 'LLUU' is no kind \(L, P, U\), layout name or fraction \(names: "),
    ],
)
def test_bad_layouts_name_the_key_and_value(text: str, clients: int, share: float, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_layout(text, clients, share)


def test_partial_fraction_is_solved_to_meet_the_labeled_share() -> None:
    sizes = [100, 300, 200, 400]  # L, P, P, U: 100 + a * 500 = 0.2 * 1000 -> a = 0.2
    assert label_fractions(["L", "P", "P", "U"], sizes, 0.2) == pytest.approx([1.0, 0.2, 0.2, 0.0])
    with pytest.raises(ValueError, match=r"labeled-share=0.05: the fully labeled clients hold 100 of 1000"):
        label_fractions(["L", "P", "P", "U"], sizes, 0.05)  # a < 0: the L client alone exceeds 5%
    assert label_fractions([1.0, 0.5], sizes[:2], 0.9) == [1.0, 0.5]  # fractions given: the share follows
    labeled, unlabeled = labeled_rows(np.arange(10, 20), 0.3, np.random.default_rng(0))
    assert len(labeled) == 3 and sorted(np.concatenate([labeled, unlabeled]).tolist()) == list(range(10, 20))


def test_simulated_clients_hold_the_parts_their_kind_has() -> None:
    cfg = resolve_config({"client-setting": "annotation-heterogeneity", "label-layout": "L,P,U", "labeled-share": 0.5})
    clients = [simulated.load_client(cfg, k, 3, frozenset({"labeled", "unlabeled"})) for k in range(3)]
    assert clients[0].unlabeled is None and clients[0].labeled is not None
    assert clients[2].labeled is None and clients[2].unlabeled is not None
    labeled = sum(len(c.labeled) for c in clients if c.labeled is not None)
    total = labeled + sum(len(c.unlabeled) for c in clients if c.unlabeled is not None)
    assert labeled / total == pytest.approx(0.5, abs=1e-3)


def test_node_folders_hold_only_the_parts_a_client_has(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from fedul_flwr.data.node_folder.reader import validate_node_dir
    from fedul_flwr.data.datasets import run_dataset_info
    from fedul_flwr.node_data_cli import write_nodes

    cfg = resolve_config({"client-setting": "annotation-heterogeneity", "label-layout": "L,P,U", "labeled-share": 0.5})
    info = run_dataset_info(cfg)
    paths = write_nodes(cfg, tmp_path, 3, max_set_size=50)
    parts = [validate_node_dir(p, info.class_names, info.image_size, info.channels).parts for p in paths]
    assert ["unlabeled" in p for p in parts] == [False, True, True]
    assert ["labeled" in p for p in parts] == [True, True, False]
