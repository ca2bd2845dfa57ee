"""Tests of the transition layer Q_c (Lu et al., ICLR 2022, Theorem 1 / Eq. 8, Lemma 2)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedul_flwr.cli import main as fedul
from fedul_flwr.config import parse_test_prior
from fedul_flwr.methods.fedul.transition import LOSSES, TransitionLayer, surrogate_loss


def _normal_pdf(x: np.ndarray, mean: float, sd: float) -> np.ndarray:
    return np.exp(-0.5 * ((x - mean) / sd) ** 2) / (sd * np.sqrt(2 * np.pi))


def _q_numpy(eta: np.ndarray, pi_mat: np.ndarray, pibar: np.ndarray, pi: np.ndarray) -> np.ndarray:
    """Eq. 8 in the probability domain: [B, K] -> [B, M]."""
    qt = eta @ (pibar[:, None] * pi_mat / pi[None, :]).T
    return qt / qt.sum(axis=1, keepdims=True)


def test_theorem1_recovers_true_surrogate_posterior() -> None:
    """On a 1-D Gaussian mixture, Q_c(eta(x)) equals p(ybar = m | x) computed directly."""
    means, sds = np.array([-2.0, 0.0, 2.5]), np.array([1.0, 0.7, 1.3])
    pi = np.array([0.5, 0.3, 0.2])  # non-uniform test prior: Q must divide by it
    pi_mat = np.array([[0.7, 0.2, 0.1], [0.1, 0.8, 0.1], [0.2, 0.2, 0.6], [0.4, 0.1, 0.5]])
    sizes = np.array([100.0, 250.0, 150.0, 50.0])
    pibar = sizes / sizes.sum()
    assert np.linalg.matrix_rank(pi_mat) == 3

    x = np.linspace(-6, 6, 241)
    lik = np.stack([_normal_pdf(x, m, s) for m, s in zip(means, sds)], axis=1)  # [B, K] p(x|k)
    joint_bar = pibar[None, :] * (lik @ pi_mat.T)  # pibar[m] p_m(x)
    true_bar = joint_bar / joint_bar.sum(axis=1, keepdims=True)
    eta = pi * lik / (pi * lik).sum(axis=1, keepdims=True)

    layer = TransitionLayer(pi_mat, pibar, pi)
    out = layer(torch.tensor(np.log(eta), dtype=torch.float64)).exp().numpy()
    assert out.shape == (x.size, 4)
    np.testing.assert_allclose(out, true_bar, atol=1e-5)
    # any logits with the same softmax give the same result (shift invariance)
    out2 = layer(torch.tensor(np.log(eta) + 7.0, dtype=torch.float32)).exp().numpy()
    np.testing.assert_allclose(out2, true_bar, atol=1e-5)
    # dropping pi (the authors' code) would be wrong for this non-uniform test prior
    wrong = _q_numpy(eta, pi_mat, pibar, np.full(3, 1 / 3))
    assert np.abs(wrong - true_bar).max() > 1e-2


def test_identity_case() -> None:
    """M = K, Pi = I, pibar = pi: Q(eta) = eta."""
    rng = np.random.default_rng(0)
    for pi in (np.full(4, 0.25), np.array([0.1, 0.2, 0.3, 0.4])):
        layer = TransitionLayer(np.eye(4), pi, pi)
        logits = torch.tensor(rng.normal(size=(32, 4)) * 3)
        out = layer(logits)
        torch.testing.assert_close(out, F.log_softmax(logits, dim=1), atol=1e-6, rtol=0)


def test_injective_for_full_rank_and_not_for_rank_deficient() -> None:
    rng = np.random.default_rng(1)
    K, M = 3, 5
    pi = np.array([0.2, 0.3, 0.5])
    pi_mat = rng.uniform(0.1, 0.9, size=(M, K))
    pi_mat /= pi_mat.sum(axis=1, keepdims=True)
    pibar = rng.uniform(0.5, 1.5, size=M)
    pibar /= pibar.sum()
    layer = TransitionLayer(pi_mat, pibar, pi)
    eta1, eta2 = rng.dirichlet(np.ones(K), size=200), rng.dirichlet(np.ones(K), size=200)
    q1 = layer(torch.tensor(np.log(eta1))).exp().numpy()
    q2 = layer(torch.tensor(np.log(eta2))).exp().numpy()
    assert np.all(np.abs(q1 - q2).sum(axis=1) > 1e-4)
    # Lemma 2 constructively: eta is recovered from Q through the left inverse of A = D(pibar) Pi D(pi)^-1
    a_mat = pibar[:, None] * pi_mat / pi[None, :]
    rec = q1 @ np.linalg.pinv(a_mat).T
    rec /= rec.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(rec, eta1, atol=1e-5)

    # rank deficient: column 3 = mean of columns 1 and 2 -> null vector u = (1, 1, -2)
    c12 = np.array([[0.8, 0.1], [0.1, 0.6], [0.3, 0.3], [0.5, 0.2]])
    deficient = np.column_stack([c12, c12.mean(axis=1)])
    deficient /= deficient.sum(axis=1, keepdims=True)  # row scaling keeps the null vector
    assert np.linalg.matrix_rank(deficient) == 2
    pi_u = np.full(3, 1 / 3)  # D(pi) u sums to 0, so both etas stay on the simplex
    bad = TransitionLayer(deficient, np.full(4, 0.25), pi_u)
    e1 = np.array([[0.3, 0.3, 0.4]])
    e2 = e1 + 0.1 * np.array([[1.0, 1.0, -2.0]])
    assert np.abs(e1 - e2).max() > 0.1
    out1 = bad(torch.tensor(np.log(e1))).exp()
    out2 = bad(torch.tensor(np.log(e2))).exp()
    torch.testing.assert_close(out1, out2, atol=1e-6, rtol=0)


def test_zero_priors_give_no_nan() -> None:
    pi_mat = np.array([[1.0, 0.0, 0.0], [0.0, 0.5, 0.5], [0.2, 0.3, 0.5], [0.3, 0.3, 0.4]])
    pibar = np.array([0.4, 0.3, 0.3, 0.0])  # set 3 is a padded / empty set
    layer = TransitionLayer(pi_mat, pibar, np.full(3, 1 / 3))
    logits = torch.tensor(
        [[0.0, 0.0, 0.0], [50.0, -50.0, 0.0], [-1e4, 1e4, 0.0], [3.0, -2.0, 1.0]], requires_grad=True
    )
    out = layer(logits)
    assert torch.isfinite(out[:, :3]).all()
    assert torch.isneginf(out[:, 3]).all()
    assert not torch.isnan(out).any()
    torch.testing.assert_close(out.exp().sum(dim=1), torch.ones(4), atol=1e-5, rtol=0)
    ybar = torch.tensor([0, 1, 2, 0])
    for kind in LOSSES:
        logits.grad = None
        loss = surrogate_loss(layer(logits), ybar, kind)
        assert torch.isfinite(loss)
        loss.backward()
        assert torch.isfinite(logits.grad).all(), kind
    # the padded set changes nothing: same outputs and gradients as a layer without it
    unpadded = TransitionLayer(pi_mat[:3], pibar[:3], np.full(3, 1 / 3))
    ref_logits = logits.detach().clone().requires_grad_(True)
    logits.grad = None
    surrogate_loss(layer(logits), ybar).backward()
    surrogate_loss(unpadded(ref_logits), ybar).backward()
    torch.testing.assert_close(layer(logits)[:, :3], unpadded(ref_logits))
    torch.testing.assert_close(logits.grad, ref_logits.grad)


def test_no_parameters_and_separate_state_dict() -> None:
    layer = TransitionLayer(np.eye(3), np.full(3, 1 / 3), np.full(3, 1 / 3))
    assert list(layer.parameters()) == []
    assert [name for name, _ in layer.named_buffers()] == ["log_coef"]
    assert layer.log_coef.dtype == torch.float32 and not layer.log_coef.requires_grad
    f = torch.nn.Linear(5, 3)
    wrapped = torch.nn.Sequential(f, layer)
    assert not any("log_coef" in key for key in f.state_dict())
    # non-persistent: the client's priors are not part of what gets exchanged
    assert set(wrapped.state_dict()) == {f"0.{k}" for k in f.state_dict()}
    before = layer.log_coef.clone()
    opt = torch.optim.SGD(wrapped.parameters(), lr=0.1)
    surrogate_loss(wrapped(torch.randn(8, 5)), torch.randint(0, 3, (8,))).backward()
    opt.step()
    assert torch.equal(layer.log_coef, before)


def test_surrogate_loss_kinds() -> None:
    torch.manual_seed(0)
    log_q = F.log_softmax(torch.randn(16, 6), dim=1)
    ybar = torch.randint(0, 6, (16,))
    torch.testing.assert_close(surrogate_loss(log_q, ybar), F.nll_loss(log_q, ybar))
    torch.testing.assert_close(surrogate_loss(log_q, ybar, "nll"), -log_q[torch.arange(16), ybar].mean())
    q = log_q.exp()
    ce = surrogate_loss(log_q, ybar, "ce-prob")
    torch.testing.assert_close(ce, F.cross_entropy(q, ybar))
    torch.testing.assert_close(ce, (-q[torch.arange(16), ybar] + torch.logsumexp(q, dim=1)).mean())
    assert not torch.allclose(ce, surrogate_loss(log_q, ybar, "nll"))
    with pytest.raises(ValueError, match="nll.*ce-prob"):
        surrogate_loss(log_q, ybar, "mae")


def test_constructor_errors_name_the_argument() -> None:
    with pytest.raises(ValueError, match="surrogate_prior"):
        TransitionLayer(np.eye(3), np.ones(2) / 2, np.ones(3) / 3)
    with pytest.raises(ValueError, match="test_prior"):
        TransitionLayer(np.eye(3), np.ones(3) / 3, np.ones(4) / 4)
    with pytest.raises(ValueError, match="test_prior.*positive"):
        TransitionLayer(np.eye(3), np.ones(3) / 3, np.array([0.5, 0.5, 0.0]))
    with pytest.raises(ValueError, match="priors"):
        TransitionLayer(np.array([[0.5, -0.1, 0.6]] * 3), np.ones(3) / 3, np.ones(3) / 3)
    layer = TransitionLayer(np.eye(3), np.ones(3) / 3, np.ones(3) / 3)
    with pytest.raises(ValueError, match=r"\[B, 3\]"):
        layer(torch.zeros(2, 4))


def test_parse_test_prior() -> None:
    np.testing.assert_allclose(parse_test_prior("uniform", 4), np.full(4, 0.25))
    np.testing.assert_allclose(parse_test_prior(" Uniform ", 2), [0.5, 0.5])
    np.testing.assert_allclose(parse_test_prior("0.1, 0.2,0.7", 3), [0.1, 0.2, 0.7])
    with pytest.raises(ValueError, match="expected 3 values.*got 2"):
        parse_test_prior("0.5,0.5", 3)
    with pytest.raises(ValueError, match="'abc' is not a number"):
        parse_test_prior("0.5,abc", 2)
    with pytest.raises(ValueError, match="entry 1 = 0 must be > 0"):
        parse_test_prior("1.0,0.0", 2)
    with pytest.raises(ValueError, match="entry 0 = -0.2"):
        parse_test_prior("-0.2,1.2", 2)
    with pytest.raises(ValueError, match="sum to 0.9"):
        parse_test_prior("0.3,0.3,0.3", 3)
    with pytest.raises(ValueError, match="finite"):
        parse_test_prior("nan,0.5", 2)
    with pytest.raises(ValueError, match="expected 10 values"):
        parse_test_prior(0.1, 10)


def test_a_bad_test_prior_is_refused_in_one_line_naming_it_once(capsys: pytest.CaptureFixture[str]) -> None:
    """Through ``fedul check`` (the settings' door): the key once, the value, and no class count
    guessed from the tokens (K is the dataset's)."""
    assert fedul(["check", "--run-config", "test-prior='0.5,abc'"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.endswith("test-prior='0.5,abc': 'abc' is not a number; use 'uniform' or one probability per class, comma-separated")
    assert err.count("test-prior") == 1 and "\n" not in err
