"""Differential privacy switches: Flower's DP strategy wrappers and ``LocalDpMod``'s mechanism, by config.

The package holds one concept a module: the mechanism's parts (:mod:`~fedul_flwr.privacy.mechanism`:
clipping, noise, the modes), the accounting (:mod:`~fedul_flwr.privacy.accounting`: epsilon, the
neighbouring relation, the numbers a run may type), the server-side wrappers
(:mod:`~fedul_flwr.privacy.server`) and the client-side mod (:mod:`~fedul_flwr.privacy.client`).

``differential-privacy`` selects one mechanism:

- ``server-fixed``: :class:`~flwr.serverapp.strategy.DifferentialPrivacyServerSideFixedClipping`
  (McMahan et al., "Learning Differentially Private Recurrent Language Models", ICLR 2018):
  the server clips each client's update Delta_c = w_c - w to L2 norm at most C
  (``dp-clipping-norm``), averages with equal weights, and adds Gaussian noise
  N(0, (z C / n)^2) per coordinate (z = ``dp-noise-multiplier``, n = the number of clipped
  updates). It protects the *released* global model against inference about any one client's
  participation; the server itself still sees every unclipped update.
- ``server-adaptive``: :class:`~flwr.serverapp.strategy.DifferentialPrivacyServerSideAdaptiveClipping`
  (Andrew et al., "Differentially Private Learning with Adaptive Clipping", NeurIPS 2021): as
  above, with C tracking the update norms so that a ``dp-target-clipped-quantile`` share of
  them is clipped (geometric step ``dp-clip-norm-lr``), starting from ``dp-clipping-norm``.
- ``client-local``: the Gaussian mechanism of Flower's :class:`~flwr.clientapp.mod.LocalDpMod`
  on every node (:func:`~fedul_flwr.privacy.client.local_dp_mod`): the client clips its own update to ``dp-clipping-norm``
  and adds Gaussian noise of standard deviation ``dp-sensitivity * sqrt(2 ln(1.25 / dp-delta)) /
  dp-epsilon`` before the reply leaves the node, so neither the server nor the network sees the
  exact update. It costs far more accuracy than central DP for the same (epsilon, delta).

Which strategies and methods a mode may run with is declared in
:mod:`fedul_flwr.strategies.contract` and checked before round 1.

The server-side wrappers are Flower's classes (construction, sampling, evaluation), their
aggregation this module's (:class:`~fedul_flwr.privacy.server.ClippableReplies`), because Flower's, measured in
``tests/test_privacy_robustness.py`` and ``tests/test_dp_contract.py``:

- divides by the update's norm (a zero update crashed the run; a NaN one passed unclipped):
  here :func:`~fedul_flwr.privacy.mechanism.clip_update` leaves a zero update zero, and a non-finite update becomes a failed
  reply of its node;
- adds the noise after the strategy's server step (FedAvgM, FedOpt), where one client moves
  the release by more than C / n: here :class:`~fedul_flwr.privacy.server.NoisedMean` adds it to the clipped mean, before
  the step;
- draws the noise from numpy's global generator: here each release draws from its own
  :func:`~fedul_flwr.privacy.mechanism.release_generator`, seeded from the OS CSPRNG, so no seed, record or folder of the
  run regenerates it and no global state is touched;
- moves the adaptive norm away from its target. Andrew et al. (Alg. 1) update
  C <- C exp(-eta (b - gamma)) with b the fraction of updates *not* clipped and gamma its
  target; Flower passes the fraction that *was* clipped as b (measured: 1e-3 -> 0.82e-3 in 2
  rounds when every update is clipped). :class:`~fedul_flwr.privacy.server.QuantileTracking` applies the paper's rule,
  C <- C exp(eta (clipped - ``dp-target-clipped-quantile``)).

Fitting them to this project's messages: n is set each round to the number of updates actually
clipped (sampled clients minus the ones that sat the round out or failed); replies must carry
exactly the global arrays in their order (a guard: the contract refuses HASSLE and SCAFFOLD
under server DP before round 1); the clients' aggregated train metrics are not recorded under
server DP unless ``dp-publish-unnoised-train-metrics`` is set (they are outside the epsilon).
Under ``client-local`` uploaded scalar statistics travel as they are (declared public in
:mod:`fedul_flwr.strategies.contract`); SCAFFOLD's control variates and FedDB's APP-U are refused. Under server-side DP the run aggregates with
``aggregation-weights=uniform`` (:func:`fedul_flwr.config.server_dp_weights` sets it, with a
notice, where it was not typed; a typed ``num-examples`` is refused): z C / n on the mean gives
every client noise multiplier z only under equal weights.

The privacy spent: :func:`~fedul_flwr.privacy.accounting.privacy_spent` gives (epsilon, delta) after each round, an upper
bound for the sampling the run performs (``participation``,
:mod:`fedul_flwr.strategies.participation`), recorded per round in the run's metrics and in the
summary line with the guarantee it is for (:func:`~fedul_flwr.privacy.accounting.neighbours`):

- ``server-fixed`` (client-level DP of the released models), by :func:`~fedul_flwr.privacy.accounting.round_event`: with every
  node training every round, neighbouring federations differ by adding or removing one client
  (the number n of updates a round averages is public) and a round is the Gaussian mechanism
  with multiplier z on the sum of the clipped updates; with a fixed-size cohort of m < N nodes,
  a removed client's place goes to another node, so the relation is replace-one (sensitivity
  2C, multiplier z / 2) with amplification by sampling m of N without replacement; with
  ``participation=poisson`` (each node with probability q, the sum divided by the fixed qN)
  it is add-or-remove with Poisson amplification. Composed by ``dp-accounting``'s RDP
  accountant. Amplification needs a cohort no one can predict: under server-side DP the
  cohort is drawn from the OS CSPRNG.
- ``client-local`` (local DP of each node's replies, neighbouring inputs are any two local data
  sets of the node): each reply is the Gaussian mechanism with standard deviation
  sigma = ``dp-sensitivity * sqrt(2 ln(1.25 / dp-delta)) / dp-epsilon`` on an update clipped to
  C, so two replies of a node differ by at most 2C in L2 norm: noise multiplier sigma / (2C),
  composed over every round by ``dp-accounting``'s RDP accountant (a node that sat rounds out
  spent less).
- Beside the composed figure both record the tight epsilon of one round's release at the
  same delta (``privacy-epsilon-round``, :func:`~fedul_flwr.privacy.accounting.round_epsilon`): the analytic Gaussian
  mechanism of Balle & Wang (ICML 2018, Thm. 8) by ``dp-accounting``'s ``GaussianPrivacyLoss``,
  or the subsampled Gaussian's dominating pair (:func:`~fedul_flwr.privacy.accounting.subsampled_gaussian_epsilon`). For ``client-local`` it
  is what ``dp-epsilon`` promises only in part: ``LocalDpMod``'s sigma is the classic bound,
  valid for ``dp-epsilon`` < 1; with ``dp-sensitivity`` = 2C one reply is below ``dp-epsilon``
  up to about 8.4 and above it beyond (2.2e4 at ``dp-epsilon`` = 1000).
- ``server-adaptive`` runs two Gaussian queries a round (Andrew et al., Sec. 3): the clipped
  sum with noise multiplier z_Delta and the count of clipped updates with standard deviation
  sigma_b (sensitivity 1/2 once the bits are centred, as the fraction's public denominator n
  allows; under Poisson sampling the centred sum is divided by qN, under replace-one both
  sensitivities double and the multiplier is z / 2). Together they are one Gaussian mechanism with 1 / z^2 = 1 / z_Delta^2 + 1 / (2
  sigma_b)^2, so z = ``dp-noise-multiplier`` is accounted exactly as ``server-fixed``'s and
  the update carries z_Delta = (z^-2 - (2 sigma_b)^-2)^-1/2 > z. The paper recommends
  sigma_b = m / 20 for a cohort of m clients, which needs m > 10 z (Flower's wrapper refuses the
  rest, and it was built with m = 1). Here sigma_b = ``dp-clipped-count-stddev`` when typed,
  else max(m / 20, z) with m the nodes a round samples (:func:`~fedul_flwr.privacy.accounting.clipped_count_stddev`): the
  paper's value where it costs the update at most a factor 2 / sqrt(3) = 1.155 in noise, z
  below (the same factor; 5 clients at z = 1 get sigma_b = 1, a clipped-share noise of 0.2).

Secure aggregation (Flower's SecAgg+: ``secaggplus_mod`` and ``SecAggPlusWorkflow``) would
hide individual updates from the server altogether; it drives the rounds through Flower's
workflow API rather than the Message-API strategies used here, and is not wired in.
"""
