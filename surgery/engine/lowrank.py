"""Low-rank factors of a weight's change: the SVD behind `surgery extract-lora`.

`delta = W_trained - W_base` (float32) is factored as `U S V^T`; its best rank-r approximation
(Eckart-Young) is `B A` with, by default, `A = sqrt(S_r) V_r^T` and `B = U_r sqrt(S_r)` (the scale
distributed over both factors, as mergekit-extract-lora does), or `A = S_r V_r^T`, `B = U_r`
(`distribute_scale=False`). The Frobenius error of the approximation is the norm of the
discarded singular values.

Two solvers:
- `full` (default): `torch.linalg.svd` in float32, exact to float32 rounding.
- `randomized`: `torch.svd_lowrank` (Halko et al.) with `OVERSAMPLE` extra columns and
  `ITERATIONS` power iterations, seeded from (seed, tensor name) so a run reproduces exactly;
  it costs O(m n (r + p)) instead of O(m n min(m, n)), for large matrices at a small rank. Its
  singular values are estimates: accurate when the spectrum decays past rank r + p.

The randomized solver seeds torch's global generator: callers run one factorization at a time.
Its sketch depends on the number of columns drawn, so a rank chosen from its singular values
(`kept_rank`) is factored from the same sketch: `factor(..., sketch_rank=)` takes the rank that
`singular_values` was given.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

SOLVERS = ("full", "randomized")
# Columns sampled beyond the rank, and power iterations, of the randomized solver (Halko,
# Martinsson and Tropp 2011 recommend 5-10 and 1-2; torch.svd_lowrank's own default is 2).
OVERSAMPLE = 10
ITERATIONS = 2


@dataclass(frozen=True)
class Solver:
    """How a weight's change is factored (see the module docstring)."""

    method: str = "full"
    seed: int = 0
    distribute_scale: bool = True


def tensor_seed(seed: int, name: str) -> int:
    """The randomized solver's seed for one tensor: a function of (seed, name) only."""
    digest = hashlib.blake2b(f"{seed}:{name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & (2**63 - 1)


def _decomposition(
    delta: torch.Tensor, rank: int, solver: Solver, name: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(U, S, V^T) of `delta`, at least `rank` singular triplets (all of them for `full`)."""
    import torch

    if solver.method == "full":
        return torch.linalg.svd(delta, full_matrices=False)
    columns = min(rank + OVERSAMPLE, min(delta.shape))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(tensor_seed(solver.seed, name))
        u, s, v = torch.svd_lowrank(delta, q=columns, niter=ITERATIONS)
    return u, s, v.T


def singular_values(delta: torch.Tensor, rank: int, solver: Solver, name: str) -> torch.Tensor:
    """The singular values of `delta` the solver sees (descending): all of them for `full`, the
    estimated top `rank + OVERSAMPLE` for `randomized` (those of `factor`'s decomposition with
    `sketch_rank=rank`)."""
    import torch

    if solver.method == "full":
        return torch.linalg.svdvals(delta)
    return _decomposition(delta, rank, solver, name)[1]


def factor(
    delta: torch.Tensor, rank: int, solver: Solver, name: str, sketch_rank: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(A, B) of shapes (rank, n) and (m, rank), float32, with `B @ A` the rank-`rank`
    approximation of `delta` (m, n).

    Args:
        sketch_rank: the rank the randomized solver draws its sketch for (default `rank`; at
            least `rank`): the one given to `singular_values` when `rank` was chosen from them,
            so the factors keep exactly the singular values that chose it (another number of
            columns is another sketch, whose values may fall on the other side of a threshold).
    """
    import torch

    u, s, vh = _decomposition(delta, max(rank, sketch_rank or rank), solver, name)
    s = s[:rank]
    if solver.distribute_scale:
        root = torch.sqrt(s)
        return root[:, None] * vh[:rank], u[:, :rank] * root[None, :]
    return s[:, None] * vh[:rank], u[:, :rank].contiguous()


def kept_rank(values: torch.Tensor, max_rank: int, sv_epsilon: float) -> int:
    """mergekit-extract-lora's rank: at most `max_rank`, and with `sv_epsilon` > 0 only the
    singular values above it (an absolute threshold, as mergekit's `--sv-epsilon`)."""
    rank = min(max_rank, values.shape[0])
    if sv_epsilon > 0:
        rank = min(rank, int((values > sv_epsilon).sum()))
    return rank
