"""Posteriors over batches that share rows, computed once and gathered per batch.

The local search (``acquisition/local_search.py``) scores thousands of candidates as ``b x 1 x d``
batches. BoTorch's qLogNEI (and qLogNEHVI) append the baseline to every batch
(``X_full = [X_baseline, x_i]``) and X_pending after it, so ``model.posterior`` sees a
``b x k x d`` input whose ``k - 1`` other rows are the same in every batch. GPyTorch then
expands the training inputs to the batch shape, concatenates and ``index_select``s the
kernels' active dimensions on ``b x (n + k) x d`` tensors, and evaluates the kernels
batch by batch: on the 100-knob mixed space with 100 trials a 512-point batch took 0.2 s,
about 15 of a suggestion's 19 s.

``SharedRowsModel`` wraps the model for such calls: it computes the posterior once,
non-batched, over the *unique rows* of the input (the ``s`` rows shared by every batch,
then each batch's own rows) with the wrapped model's own ``posterior`` (so its outcome
transform untransforms as usual), and builds the batched posterior by gathering, for each
batch, the mean of its rows and the covariance block between them. Each gathered entry is
the entry the batched call computes (the same kernel values and the same solves against
the training covariance, one column at a time), so the acquisition values agree up to
floating-point rounding (1e-14 relative measured; the tests check 1e-9); the acquisition
code itself is BoTorch's, unchanged. With one own row per batch (the local search's case:
the candidate, with the baseline and pending points shared) only the covariance columns of
the shared rows and the own rows' variances are read from the lazy posterior covariance;
GPyTorch still evaluates the prior kernel between all ``u`` unique rows, which is why the
categorical kernel is a matrix product (``models/kernels.py``). With that kernel a 512-candidate
batch of the space above takes about 0.03 s.

The gathered path is taken only where that holds and pays, and the plain call is made
otherwise:

* ``X`` is ``b x k x d`` with ``b > 1``, and the model's own batch shape is empty;
* no ``observation_noise`` and no extra keyword arguments are asked for (a
  ``posterior_transform`` is applied to the gathered posterior, as the models do);
* one own row per batch, or several with fewer covariance entries than the batched call
  (``u**2 < b * k**2``, ``u = s + b * (k - s)`` unique rows; then the whole ``u x u``
  covariance is evaluated and gathered);
* the posterior over the unique rows is a ``GPyTorchPosterior`` (not a subclass) over a
  ``MultivariateNormal``, or over a ``MultitaskMultivariateNormal`` whose covariance is
  block diagonal by output (``interleaved=False``, ``BlockDiagLinearOperator``: what a
  ``ModelListGP`` and a batched multi-output ``SingleTaskGP`` produce, and what BoTorch's
  cached-Cholesky sampling requires).

The gathered posterior has the structure the batched call returns (a multi-output one is
again block diagonal by output, non-interleaved), with dense covariance blocks. The local
search scores through it without gradients; L-BFGS-B on continuous spaces differentiates
through it (its ``num_restarts`` batches share the baseline too: the step at d = 100,
n = 100 took 1.00 s instead of 1.25 s, the picks equal to 3e-11), and the gradients are the
plain call's to rounding (the tests check 1e-9).

**From the GP's own caches.** For batches with one own row each (the candidate) over a
``SingleTaskGP`` (one or several outputs, without input transform, with a ``Standardize``
outcome transform or none) or a ``ModelListGP`` of such single-output GPs, the gathered
entries are computed directly, as GPyTorch's exact prediction computes them under BoTorch's
posterior settings (``fast_pred_var``): the GP's prediction strategy already holds
``mean_cache`` (``(K + s^2 I)^-1 (y - m)``) and ``covar_cache`` (``S`` with ``S S^T =
(K + s^2 I)^-1``); with ``A = K(u, X) S`` the means are ``m(u) + K(u, X) mean_cache``, the
own rows' variances ``k(x, x) - |A_x|^2`` and the shared columns ``K(u, shared) - A
A_shared^T``, then un-standardized. The same kernel values and caches, without GPyTorch's
lazy operators (whose generic diagonal of the ``u x u`` product alone was 0.8 of a 5.4 s
local search on the 100-knob mixed space). Until the model has a prediction strategy (the
acquisition's own first posterior call makes it), the path above is taken.

Rounding differences stay at rounding level where the batch's joint covariance is well
conditioned. A candidate equal to a pending point makes it singular, and the jitter
BoTorch's Cholesky then adds amplifies them (1e-3 in a log value measured); the local
search never scores a taken configuration, so this does not arise there.
"""

from __future__ import annotations

from typing import Any, cast

import torch
from botorch.acquisition import AcquisitionFunction
from botorch.models import ModelListGP, SingleTaskGP
from botorch.models.model import Model
from botorch.models.transforms.outcome import Standardize
from botorch.models.utils.assorted import gpt_posterior_settings
from botorch.posteriors import GPyTorchPosterior, Posterior
from gpytorch import settings as gpytorch_settings
from gpytorch.distributions import MultitaskMultivariateNormal, MultivariateNormal
from gpytorch.likelihoods import GaussianLikelihood
from gpytorch.models.exact_prediction_strategies import DefaultPredictionStrategy
from linear_operator import to_dense
from linear_operator.operators import (
    BlockDiagLinearOperator,
    DenseLinearOperator,
    LinearOperator,
)
from torch import Tensor


class SharedRowsModel(Model):
    """``model`` whose posterior over batches sharing rows is gathered (module doc)."""

    def __init__(self, model: Model) -> None:
        super().__init__()
        self.model = model

    @property
    def num_outputs(self) -> int:
        return self.model.num_outputs

    @property
    def batch_shape(self) -> torch.Size:
        return self.model.batch_shape

    def posterior(
        self,
        X: Tensor,
        output_indices: list[int] | None = None,
        observation_noise: bool | Tensor = False,
        posterior_transform: Any = None,
        **kwargs: Any,
    ) -> Posterior:
        plan = None
        if observation_noise is False and not kwargs and len(self.model.batch_shape) == 0:
            plan = _plan(X)
        if plan is not None:
            unique, index, s = plan
            direct = _direct(self.model, unique, index, s) if output_indices is None else None
            if direct is not None:
                if posterior_transform is not None:
                    return posterior_transform(posterior=direct, X=X)
                return direct
            posterior = self.model.posterior(unique, output_indices=output_indices)
            gathered = _gather(posterior, index, s)
            if gathered is not None:
                if posterior_transform is not None:
                    return posterior_transform(posterior=gathered, X=X)
                return gathered
        return self.model.posterior(
            X,
            output_indices=output_indices,
            observation_noise=observation_noise,
            posterior_transform=posterior_transform,
            **kwargs,
        )


class shared_rows:
    """Context manager: ``acquisition.model`` is a ``SharedRowsModel`` inside, the model
    itself again on leaving (an acquisition without a BoTorch ``Model`` is left as it is).

    Only around forward calls: BoTorch decides whether to cache the baseline's Cholesky
    factor from the model's type (``supports_cache_root``), so ``set_X_pending`` (which
    re-initializes the baseline) must see the model itself.
    """

    def __init__(self, acquisition: AcquisitionFunction) -> None:
        self.acquisition = acquisition
        model = getattr(acquisition, "model", None)
        self.model = model if isinstance(model, Model) else None

    def __enter__(self) -> AcquisitionFunction:
        if self.model is not None:
            self.acquisition.model = SharedRowsModel(self.model)
        return self.acquisition

    def __exit__(self, *exc: object) -> None:
        if self.model is not None:
            self.acquisition.model = self.model


def _plan(X: Tensor) -> tuple[Tensor, Tensor, int] | None:
    """The unique rows of a ``b x k x d`` input (``u x d``: the ``s`` rows equal in every
    batch, then each batch's other rows), for each batch the indices of its rows among them
    (``b x k``), and ``s``; None when that does not pay or ``X`` is not ``b x k x d`` with
    ``b > 1``."""
    if X.dim() != 3 or X.shape[0] < 2:
        return None
    b, k, d = X.shape
    shared = (X[:1] == X).all(dim=-1).all(dim=0)  # k
    s = int(shared.sum())
    if s < k - 1 and (s + b * (k - s)) ** 2 >= b * k * k:
        return None  # several own rows per batch: the whole u x u covariance is gathered
    own = ~shared
    unique = torch.cat([X[0, shared], X[:, own].reshape(-1, d)])
    index = torch.empty(b, k, dtype=torch.long)
    index[:, shared] = torch.arange(s)
    index[:, own] = s + torch.arange(b * (k - s)).reshape(b, k - s)
    return unique, index, s


def _blocks(covariance: LinearOperator, index: Tensor, s: int) -> Tensor:
    """The ``... x b x k x k`` covariance blocks of the batches' rows, ``index`` (``b x k``)
    into the ``... x u x u`` lazy ``covariance`` of the unique rows, the first ``s`` of
    them shared.

    With one own row per batch, only the columns of the shared rows (``u x s``) and the
    variances of the own rows are evaluated: the covariances between different batches'
    own rows, most of the ``u x u`` matrix, are never needed. Otherwise the whole matrix
    is evaluated and gathered.
    """
    k = index.shape[1]
    if s != k - 1:
        dense = covariance.to_dense()
        return dense[..., index.unsqueeze(-1), index.unsqueeze(-2)]
    variances = covariance[..., s:, s:].diagonal(dim1=-2, dim2=-1)  # ... x b
    columns = covariance[..., :, :s].to_dense() if s else None  # ... x u x s
    return _assemble(variances, columns, index, s)


def _assemble(variances: Tensor, columns: Tensor | None, index: Tensor, s: int) -> Tensor:
    """``... x b x k x k`` blocks of batches with one own row each, from the own rows'
    ``... x b`` variances and the ``... x u x s`` covariance columns of the shared rows."""
    b, k = index.shape
    shared = index[0] < s  # positions of the shared rows (their indices are 0 .. s-1)
    own = int((~shared).nonzero())
    out = variances.new_empty(*variances.shape[:-1], b, k, k)
    out[..., own, own] = variances
    if columns is not None:
        out[..., shared] = columns[..., index, :]  # ... x b x k x s
        out[..., shared, own] = out[..., own, shared]
    return out


def _direct(model: Model, unique: Tensor, index: Tensor, s: int) -> GPyTorchPosterior | None:
    """The gathered posterior from the GPs' prediction caches (module doc), or None where
    that path does not apply."""
    if s != index.shape[1] - 1:
        return None
    moments = model_moments(model, unique, s)
    if moments is None:
        return None
    mean, variances, all_columns = moments
    columns = all_columns if s else None
    blocks = _assemble(variances, columns, index, s)  # outputs x b x k x k
    if mean.shape[-1] == 1 and type(model) is SingleTaskGP:
        return batched_posterior(mean[..., 0][index], blocks[0])
    return batched_posterior(mean[index], blocks.movedim(0, -3))


def batched_posterior(mean: Tensor, blocks: Tensor) -> GPyTorchPosterior:
    """The posterior of ``b`` batches of ``k`` rows as BoTorch's models return it: with one
    output (``mean`` ``b x k``, ``blocks`` ``b x k x k``) a ``MultivariateNormal``; with
    ``m`` (``b x k x m`` and ``b x m x k x k``) a ``MultitaskMultivariateNormal`` whose
    covariance is block diagonal by output, non-interleaved."""
    if mean.dim() == 2:
        return GPyTorchPosterior(MultivariateNormal(mean, DenseLinearOperator(blocks)))
    return GPyTorchPosterior(
        MultitaskMultivariateNormal(
            mean=mean,
            covariance_matrix=BlockDiagLinearOperator(DenseLinearOperator(blocks), block_dim=-3),
            interleaved=False,
        )
    )


def model_moments(model: Model, unique: Tensor, s: int) -> tuple[Tensor, Tensor, Tensor] | None:
    """For a ``SingleTaskGP`` (``m`` outputs) or a ``ModelListGP`` of ``m`` single-output
    ones, at ``u`` rows of which the first ``s`` are shared: the ``u x m`` means, the
    ``m x (u - s)`` variances of the other rows and the ``m x u x s`` covariances with the
    shared rows, in the outcomes' units (module doc); None for any other model or one
    without its prediction caches."""
    if not caches_settings():
        return None
    if type(model) is SingleTaskGP:
        return _moments(model, unique, s)
    gps = output_gps(model)
    if gps is None:
        return None
    each = [_moments(gp, unique, s) for gp in gps]
    found = [part for part in each if part is not None]
    if len(found) != len(each):
        return None
    return (
        torch.cat([part[0] for part in found], dim=-1),
        torch.cat([part[1] for part in found]),
        torch.cat([part[2] for part in found]),
    )


def training_marginals(model: Model, X: Tensor) -> tuple[Tensor, Tensor] | None:
    """The posterior means and variances (``n x m`` each, in the outcomes' units) of
    ``model``'s outputs at ``X``, the ``n x d`` training inputs of every output, from the
    prediction caches; None where not covered.

    At the training rows, with noise ``s^2``, ``K + s^2 I = L L^T``, ``covar_cache`` ``S =
    L^-T`` (so ``S S^T = (K + s^2 I)^-1``) and ``mean_cache`` ``a = (K + s^2 I)^-1 (y -
    m)``, GPyTorch's ``m + K a`` and ``k(x, x) - |K_x S|^2`` are

        mean = y - s^2 a,    variance = s^2 - s^4 |S_x|^2

    (``K = (K + s^2 I) - s^2 I``), which cost ``O(n^2)`` where GPyTorch's variances cost a
    ``n x n`` by ``n x n`` product: 0.15 s an output at ``n = 1000``. They agree to rounding
    (3e-13 relative measured at n = 1000; the tests check 1e-9); with a noise per row
    (``ScaledNoiseLikelihood``) ``s^2`` is that row's, the same identities row by row.
    Covered: the models ``model_moments`` covers, each output a ``GaussianLikelihood`` (or
    its per-row ``ScaledNoiseLikelihood``) trained
    on exactly ``X``, its ``covar_cache`` the exact inverse root (a Cholesky factor: at most
    ``max_cholesky_size`` rows, or GPyTorch's fast root decomposition off, as
    ``tuner.runtime`` sets it). A model without its caches yet is given them by a posterior
    at one row, which computes the same caches the acquisition uses next."""
    gps = output_gps(model)
    if gps is None or not caches_settings():
        return None
    n = X.shape[-2]
    exact = gpytorch_settings.fast_computations.covar_root_decomposition.off()
    if not exact and n > gpytorch_settings.max_cholesky_size.value():
        return None  # GPyTorch's covar_cache would be a low-rank Lanczos root
    means, variances = [], []
    for gp in gps:
        noise = row_noise(gp)
        if noise is None:
            return None
        train = gp.train_inputs[0]
        m = gp.num_outputs
        if not all(torch.equal(rows, X) for rows in (train if m > 1 else [train])):
            return None
        if gp.prediction_strategy is None:
            gp.posterior(X[:1])  # builds the prediction strategy
        strategy = prediction_caches(gp)
        if strategy is None:
            return None
        with gpt_posterior_settings():
            root = to_dense(strategy.covar_cache)  # (m x) n x n
            weights = strategy.mean_cache  # (m x) n
        mean = gp.train_targets - noise * weights
        variance = noise - noise.square() * root.square().sum(dim=-1)
        if m == 1:
            mean, variance = mean.unsqueeze(0), variance.unsqueeze(0)
        transform = getattr(gp, "outcome_transform", None)
        if transform is not None:
            scale = transform.stdvs.reshape(m, 1)
            mean = transform.means.reshape(m, 1) + scale * mean
            variance = variance * scale.square()
        means.append(mean.detach())
        variances.append(variance.detach())
    return torch.cat(means).transpose(0, 1), torch.cat(variances).transpose(0, 1)


def row_noise(gp: SingleTaskGP) -> Tensor | None:
    """The noise variance of ``gp``'s likelihood at each training row, ``(m x) n``, as
    GPyTorch adds it in the marginal likelihood and the prediction caches: one level for a
    ``GaussianLikelihood``, a level per row for a subclass that scales it (the models'
    ``ScaledNoiseLikelihood``); None for another likelihood."""
    likelihood = gp.likelihood
    if not isinstance(likelihood, GaussianLikelihood):
        return None
    X = gp.train_inputs[0]
    covariance = likelihood._shaped_noise_covar(gp.train_targets.shape, X)
    return covariance.diagonal(dim1=-2, dim2=-1).detach()


def training_precision(gp: SingleTaskGP) -> tuple[Tensor, Tensor]:
    """A fitted single-output GP's ``P = (K + N)^-1`` over its training rows (``K`` its
    kernel, ``N`` its noise at each row, ``row_noise``) and ``P (y - m(X))``, in its training
    units and with its fitted hyperparameters: what its leave-one-out predictions are made
    of (Rasmussen & Williams 2006, section 5.4.2).

    Raises:
        TypeError: The GP's likelihood is not Gaussian.
    """
    noise = row_noise(gp)
    if noise is None:
        raise TypeError(f"a Gaussian likelihood is needed, not {type(gp.likelihood).__name__}")
    with torch.no_grad():
        X = gp.train_inputs[0]
        covariance = gp.covar_module(X).to_dense() + torch.diag(noise.reshape(-1))
        precision = torch.cholesky_inverse(torch.linalg.cholesky(covariance))
        return precision, precision @ (gp.train_targets - gp.mean_module(X))


def output_gps(model: Model) -> list[SingleTaskGP] | None:
    """The ``SingleTaskGP``s whose outputs are ``model``'s, in order: the model itself, or
    the members of a ``ModelListGP`` of single-output ones; None for any other model."""
    if type(model) is SingleTaskGP:
        return [model]
    if type(model) is not ModelListGP or not all(
        type(m) is SingleTaskGP and m.num_outputs == 1 for m in model.models
    ):
        return None
    return [cast(SingleTaskGP, m) for m in model.models]


def caches_settings() -> bool:
    """Whether GPyTorch's settings let a posterior be computed from the prediction caches as
    BoTorch's posterior computes it (``fast_pred_var`` not turned off by a caller, posterior
    variances not skipped)."""
    fast = gpytorch_settings.fast_pred_var
    if not fast.is_default() and fast.off():
        return False  # BoTorch's posterior turns it on unless a caller turned it off
    return not gpytorch_settings.skip_posterior_variances.on()


def prediction_caches(model: SingleTaskGP) -> Any | None:
    """The GP's prediction strategy where its caches give the posterior as ``_moments`` (and
    ``rbf_moments``) compute it: a ``Standardize`` outcome transform or none, no input
    transform, eval mode, GPyTorch's default exact prediction strategy, no batch of the
    model's own; None otherwise (or before the model's first posterior made the caches)."""
    transform = getattr(model, "outcome_transform", None)
    if transform is not None and type(transform) is not Standardize:
        return None
    if getattr(model, "input_transform", None) is not None or model.training:
        return None
    strategy: Any = model.prediction_strategy
    if type(strategy) is not DefaultPredictionStrategy or len(model.batch_shape) != 0:
        return None
    return strategy


def _moments(model: SingleTaskGP, unique: Tensor, s: int) -> tuple[Tensor, Tensor, Tensor] | None:
    """For ``m`` outputs: the ``u x m`` means of the unique rows, the ``m x b`` variances of
    the own rows and the ``m x u x s`` covariances with the shared rows (module doc), in
    the outcome's units; None for a model this does not cover or without its caches."""
    strategy = prediction_caches(model)
    if strategy is None:
        return None
    transform = getattr(model, "outcome_transform", None)
    m = model.num_outputs
    train = model.train_inputs[0]
    rows = unique.expand(m, *unique.shape) if m > 1 else unique  # the GP's batch: outputs
    with gpt_posterior_settings():
        n = train.shape[-2]
        # one kernel call for the training rows and the shared rows: (m x) u x (n + s)
        prior = model.covar_module(rows, torch.cat([train, rows[..., :s, :]], dim=-2)).to_dense()
        cross = prior[..., :n]
        mean = model.mean_module(rows) + (cross @ strategy.mean_cache.unsqueeze(-1)).squeeze(-1)
        root = cross @ strategy.covar_cache  # (m x) u x r
        own = rows[..., s:, :]
        variances = to_dense(model.covar_module(own, own, diag=True))
        variances = variances - (root[..., s:, :] ** 2).sum(-1)
        columns = prior[..., n:] - root @ root[..., :s, :].transpose(-1, -2)
    if m == 1:
        mean, variances, columns = mean.unsqueeze(0), variances.unsqueeze(0), columns.unsqueeze(0)
    if transform is not None:
        offset = transform.means.reshape(m)
        scale = transform.stdvs.reshape(m)
        mean = offset.unsqueeze(-1) + scale.unsqueeze(-1) * mean
        variances = variances * scale.unsqueeze(-1) ** 2
        columns = columns * (scale**2).reshape(m, 1, 1)
    return mean.transpose(0, 1), variances, columns


def _gather(posterior: Posterior, index: Tensor, s: int) -> GPyTorchPosterior | None:
    """The ``b x k`` batched posterior of a posterior over ``u`` unique rows, ``index``
    (``b x k``) saying which; None for a posterior of another structure (module doc)."""
    if type(posterior) is not GPyTorchPosterior:
        return None
    mvn = posterior.distribution
    if type(mvn) is MultivariateNormal:
        if mvn.mean.dim() != 1:
            return None
        return batched_posterior(mvn.mean[index], _blocks(mvn.lazy_covariance_matrix, index, s))
    if type(mvn) is not MultitaskMultivariateNormal or mvn._interleaved:
        return None
    covar = mvn.lazy_covariance_matrix
    if not isinstance(covar, BlockDiagLinearOperator) or covar.base_linear_op.dim() != 3:
        return None
    if mvn.mean.dim() != 2:
        return None
    blocks = _blocks(covar.base_linear_op, index, s).movedim(0, -3)  # b x outputs x k x k
    return batched_posterior(mvn.mean[index], blocks)  # mean: b x k x outputs
