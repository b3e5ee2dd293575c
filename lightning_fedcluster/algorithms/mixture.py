"""E-step math shared by the soft-clustering algorithms (FedRC, FedEM): plain tensors only.

Shapes: ``losses`` is [N, K] (per-sample loss of every cluster model), ``labels`` is [N],
``log_omega`` is [K] (a client's log mixture weights), ``log_label_stats`` is [C, K]
(log C_{y,k}; ``None`` for FedEM, where C is constant). Everything runs in log space so that
large losses never underflow a weight to exactly zero.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import torch
from torch import Tensor

LABEL_STATS_FLOOR = 1e-8
REVIVE_BELOW = 1e-6  # unseen-client ω: a vanished weight that would grow restarts here
# Unseen-client ω: converged when its mean log-likelihood per sample is this close to the maximum.
GAP_TOLERANCE = 1e-12
# Unseen-client ω on a flat likelihood: stop once the client's total log-likelihood is certified
# within this many nats of the maximum (a likelihood ratio of 1.01 at most, far below what N
# samples resolve) and the certificate no longer falls tenfold in FLAT_WINDOW iterations.
FLAT_TOLERANCE = 1e-2
FLAT_WINDOW = 20


def responsibilities(
    losses: Tensor, labels: Tensor, log_omega: Tensor, log_label_stats: Tensor | None = None
) -> Tensor:
    """Log responsibilities log γ_{j;k} = log_softmax_k(log ω_k − f_jk − log C_{y_j,k}). Returns [N, K].

    ``log_omega`` may also be [N, K]: each sample's own client prior (several clients at once)."""
    log_omega = log_omega.to(losses.dtype)
    scores = (log_omega.unsqueeze(0) if log_omega.dim() == 1 else log_omega) - losses
    if log_label_stats is not None:
        scores = scores - log_label_stats.to(losses.dtype)[labels]
    return torch.log_softmax(scores, dim=1)


def mixture_from_responsibilities(log_gamma: Tensor) -> Tensor:
    """ω_k = (1/N) Σ_j γ_{j;k}, returned as log ω (exact in log space). Returns [K]."""
    n = log_gamma.shape[0]
    return torch.logsumexp(log_gamma, dim=0) - torch.log(torch.tensor(float(n), dtype=log_gamma.dtype))


def pad_clients(values: Tensor, offsets: Tensor, fill: float | int = 0) -> tuple[Tensor, Tensor]:
    """Rows of C clients (client c owns rows offsets[c]:offsets[c+1]) as [C, N_max, ...] plus a
    boolean mask [C, N_max] of real rows; padding holds ``fill``."""
    sizes = offsets.diff()
    count, longest = sizes.numel(), int(sizes.max()) if sizes.numel() else 0
    mask = torch.arange(longest, device=values.device).unsqueeze(0) < sizes.to(values.device).unsqueeze(1)
    padded = values.new_full((count, longest, *values.shape[1:]), fill)
    padded[mask] = values[int(offsets[0]) : int(offsets[-1])]
    return padded, mask


def mixtures_of_clients(log_gamma: Tensor, offsets: Tensor) -> Tensor:
    """``mixture_from_responsibilities`` of several clients at once: client c owns rows
    offsets[c]:offsets[c+1] of ``log_gamma`` [N, K]. Returns log ω [C, K]."""
    padded, _ = pad_clients(log_gamma, offsets, fill=-math.inf)
    sizes = offsets.diff().to(log_gamma.device, log_gamma.dtype)
    return torch.logsumexp(padded, dim=1) - sizes.log().unsqueeze(1)


def label_sums_of_clients(gamma: Tensor, labels: Tensor, offsets: Tensor, num_classes: int) -> Tensor:
    """``label_sums`` of several clients at once (rows as in ``mixtures_of_clients``). [C, Y, K]."""
    count, k = offsets.numel() - 1, gamma.shape[1]
    sums = torch.zeros(count * num_classes, k, dtype=gamma.dtype, device=gamma.device)
    if num_classes == 0:
        return sums.view(count, 0, k)
    owner = torch.repeat_interleave(torch.arange(count, device=gamma.device), offsets.diff().to(gamma.device))
    return sums.index_add_(0, owner * num_classes + labels, gamma).view(count, num_classes, k)


def soft_e_step_rows(
    losses: Tensor,
    labels: Tensor,
    offsets: Tensor,
    log_omega: Tensor,
    log_label_stats: Tensor | None,
    num_classes: int,
) -> tuple[Tensor, Tensor, Tensor]:
    """The soft E-step of C clients at once; client c owns rows offsets[c]:offsets[c+1] of
    ``losses`` [N, K] and ``labels`` [N] and has the prior ``log_omega[c]`` ([C, K]).

    Returns γ [N, K], ω [C, K] and the label sums S [C, Y, K], as ``responsibilities``,
    ``mixture_from_responsibilities`` and ``label_sums`` give them client by client.
    """
    rows = torch.repeat_interleave(log_omega, offsets.diff().to(losses.device), dim=0)
    log_gamma = responsibilities(losses, labels, rows, log_label_stats)
    gamma = log_gamma.exp()
    omega = mixtures_of_clients(log_gamma, offsets).exp()
    return gamma, omega, label_sums_of_clients(gamma, labels, offsets, num_classes)


def label_sums(gamma: Tensor, labels: Tensor, num_classes: int) -> Tensor:
    """S_{y,k} = Σ_{j: y_j = y} γ_{j;k}: the client's label statistics sent to the server. [C, K]."""
    sums = torch.zeros(num_classes, gamma.shape[1], dtype=gamma.dtype, device=gamma.device)
    if num_classes == 0:  # regression: no label statistics
        return sums
    return sums.index_add_(0, labels, gamma)


def label_statistics(client_label_sums: Tensor, floor: float = LABEL_STATS_FLOOR) -> Tensor:
    """Server C_{y,k} = Σ_i S_{i,y,k} / Σ_i Σ_y' S_{i,y',k}, floored at ``floor``. Input [M, C, K] or [C, K].

    A cluster with no mass at all gets the uniform label distribution.
    """
    total = client_label_sums.sum(dim=0) if client_label_sums.dim() == 3 else client_label_sums
    column = total.sum(dim=0, keepdim=True)
    uniform = torch.full_like(total, 1.0 / total.shape[0])
    stats = torch.where(column > 0, total / column.clamp_min(torch.finfo(total.dtype).tiny), uniform)
    return stats.clamp_min(floor)


@dataclass(frozen=True)
class MixtureFit:
    """An unseen client's mixture weights ``omega`` [K], the iterations it took, and ``gap``: a
    certified bound on how far its mean log-likelihood per sample is below the maximum."""

    omega: Tensor
    iterations: int
    gap: float


def iterate_mixture(
    losses: Tensor,
    labels: Tensor,
    log_label_stats: Tensor | None = None,
    *,
    max_iterations: int = 5000,
    tolerance: float = 1e-8,
    gap_tolerance: float = GAP_TOLERANCE,
    flat_tolerance: float = FLAT_TOLERANCE,
    accelerate: bool = True,
) -> Tensor:
    """Mixture weights of a client that took no part in training: the fixed point of the E-step
    map F(ω) = mean_j γ_j(ω), i.e. the maximum-likelihood ω of the client's data under the K
    fixed models. Returns ω [K] (not log); see ``fit_mixture``."""
    return fit_mixture(
        losses,
        labels,
        log_label_stats,
        max_iterations=max_iterations,
        tolerance=tolerance,
        gap_tolerance=gap_tolerance,
        flat_tolerance=flat_tolerance,
        accelerate=accelerate,
    ).omega


class _MixtureLikelihood:
    """L(ω) = Σ_j log Σ_k ω_k e^{s_jk} of fixed scores s [N, K], its E-step map F(ω) and the
    certificate ``likelihood_gap``, all three from one pass over the scores per ω."""

    def __init__(self, scores: Tensor) -> None:
        self.scores = scores

    def __call__(self, omega: Tensor) -> tuple[Tensor, float, float]:
        """(F(ω), L(ω), gap(ω)): F_k = ω_k g_k with g_k = mean_j e^{s_jk} / Σ_l ω_l e^{s_jl}."""
        log_omega = omega.clamp_min(0).log()
        log_mix = torch.logsumexp(self.scores + log_omega, dim=1, keepdim=True)
        gradient = (self.scores - log_mix).exp().mean(0)
        mapped = (self.scores + log_omega - log_mix).exp().mean(0)
        return mapped, float(log_mix.sum()), max(float(gradient.max()) - 1.0, 0.0)


def fit_mixture(
    losses: Tensor,
    labels: Tensor,
    log_label_stats: Tensor | None = None,
    *,
    max_iterations: int = 5000,
    tolerance: float = 1e-8,
    gap_tolerance: float = GAP_TOLERANCE,
    flat_tolerance: float = FLAT_TOLERANCE,
    accelerate: bool = True,
) -> MixtureFit:
    """``iterate_mixture`` with its iteration count and optimality gap.

    Stops when the mean log-likelihood per sample of ω is certified within ``gap_tolerance`` of
    the maximum (``likelihood_gap``), not when ω stops changing: where the K models' losses are
    nearly equal (early in training) the likelihood is nearly flat, and ω keeps moving (slowly,
    or back and forth along a flat direction) by more than any fixed tolerance while the data no
    longer tell its values apart.

    A flat likelihood stops earlier: once the client's total log-likelihood (N times the mean) is
    certified within ``flat_tolerance`` nats of its maximum and the certificate has stopped
    falling fast (not tenfold over the last ``FLAT_WINDOW`` iterations), the data cannot tell the
    remaining candidates apart (a likelihood ratio of at most e^flat_tolerance), and the E-step
    would only crawl towards one of them: where two models' losses are near-collinear the
    optimum is a flat ridge, and the certificate fell sublinearly for thousands of iterations.
    If the uniform start is already within ``flat_tolerance`` nats, ω cannot move and stays
    uniform (0 iterations). Where the clusters differ the certificate falls geometrically and
    the iteration goes on to ``gap_tolerance``, as before.

    A step smaller than ``tolerance`` short of the optimum is a stall: vanished weights that
    would grow are revived. Plain iteration converges only linearly near a one-hot optimum
    (thousands of steps). With ``accelerate`` each step is SQUAREM's (Varadhan & Roland 2008,
    scheme S3) on log ω: an extrapolation from two E-steps, then one E-step. Near a vertex each
    vanishing weight decays geometrically at its own rate, a straight line in log ω that one step
    length follows for all of them (on ω itself, the step length fitted to the slowest weight
    made the fast ones bounce back up, the step was refused and the iteration fell back to plain
    E-steps: the cap was hit). A step that lowers the likelihood is shortened towards the plain
    double E-step, which never does, so the likelihood never decreases. Hitting the cap is
    reported with a warning, never silently.
    """
    k = losses.shape[1]
    scores = -losses.to(torch.float64)
    if log_label_stats is not None:
        scores = scores - log_label_stats.to(scores)[labels]
    tiny = torch.finfo(scores.dtype).tiny
    evaluate = _MixtureLikelihood(scores)
    flat_gap = flat_tolerance / max(scores.shape[0], 1)  # the same bound per sample

    omega = torch.full((k,), 1.0 / k, dtype=scores.dtype, device=scores.device)
    first, _, gap = evaluate(omega)
    if gap <= max(gap_tolerance, flat_gap):
        return MixtureFit(omega, 0, gap)
    change = math.inf
    best_gaps = [gap]  # the lowest certificate so far, after each iteration
    for iteration in range(1, max_iterations + 1):
        if not accelerate:
            change, omega = float((first - omega).abs().max()), first
            first, _, gap = evaluate(omega)
        else:
            second = evaluate(first)[0]
            u0, u1, u2 = (w.clamp_min(tiny).log() for w in (omega, first, second))
            r, v = u1 - u0, u2 - 2 * u1 + u0
            norm_v = float(v.norm())
            alpha = min(-float(r.norm()) / norm_v if norm_v > 0 else -1.0, -1.0)  # -1: the double E-step
            floor = evaluate(second)[1]
            while True:
                # Each weight falls at most tenfold per step: the E-step keeps a zero weight at zero
                # forever, so a jump must not cut a cluster off.
                jump = torch.maximum(u0 - 2 * alpha * r + alpha * alpha * v, u0 - math.log(10.0))
                candidate = evaluate(torch.softmax(jump, dim=0))[0]
                mapped, value, candidate_gap = evaluate(candidate)
                if alpha == -1.0 or value >= floor:
                    break
                alpha = (alpha - 1.0) / 2 if alpha < -2.0 else -1.0
            change = float((candidate - omega).abs().max())
            omega, first, gap = candidate, mapped, candidate_gap
        if gap <= gap_tolerance:
            return MixtureFit(omega, iteration, gap)
        best_gaps.append(min(gap, best_gaps[-1]))
        stalled = iteration >= FLAT_WINDOW and best_gaps[-1] > 0.1 * best_gaps[-1 - FLAT_WINDOW]
        if gap <= flat_gap and stalled:
            return MixtureFit(omega, iteration, gap)
        if change < tolerance:
            # Stalled short of the optimum: a weight that vanished (the E-step keeps a zero at zero)
            # but would grow (KKT: mean_j p_jk / p_j <= 1 at the optimum) is revived.
            growth = first / omega.clamp_min(tiny)
            revive = (growth > 1 + gap_tolerance) & (omega < REVIVE_BELOW)
            if bool(revive.any()):
                omega = torch.where(revive, torch.full_like(omega, REVIVE_BELOW), omega)
                omega = omega / omega.sum()
                first, _, gap = evaluate(omega)
    warnings.warn(
        f"the E-step for an unseen client did not converge in {max_iterations} iterations (last change "
        f"{change:.2e}, tolerance {tolerance:.0e}; likelihood gap {gap:.2e}, tolerance "
        f"{gap_tolerance:.0e}); its mixture weights are approximate",
        RuntimeWarning,
        stacklevel=3,
    )
    return MixtureFit(omega, max_iterations, gap)


def likelihood_gap(scores: Tensor, omega: Tensor) -> float:
    """A bound on max_ω' L(ω') − L(ω), L the mean log-likelihood per sample Σ_j log Σ_k ω_k e^{s_jk} / N
    (``scores`` s [N, K]): L is concave with gradient g_k = mean_j e^{s_jk} / Σ_l ω_l e^{s_jl} and
    Σ_k ω_k g_k = 1, so L(ω') ≤ L(ω) + g·(ω' − ω) ≤ L(ω) + max_k g_k − 1 on the simplex."""
    return _MixtureLikelihood(scores)(omega)[2]


def mixture_probabilities(probs: Tensor, omega: Tensor) -> Tensor:
    """p(y|x) = Σ_k ω_k p_k(y|x). ``probs`` is [K, N, C]; ``omega`` is [K], or [N, K] for a
    weight per sample (several clients' samples at once). Returns [N, C]."""
    if omega.dim() == 2:
        return torch.einsum("knc,nk->nc", probs, omega.to(probs.dtype))
    return torch.einsum("knc,k->nc", probs, omega.to(probs.dtype))


def hard_weights(omega: Tensor) -> Tensor:
    """One-hot of argmax_k ω (lowest index on ties): the paper's hard-clustering prediction."""
    out = torch.zeros_like(omega)
    out[torch.argmax(omega)] = 1.0
    return out
