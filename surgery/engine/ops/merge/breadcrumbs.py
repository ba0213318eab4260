"""Model Breadcrumbs sparsification: drop the `gamma` fraction of largest magnitudes (outliers)
and then the smallest, keeping a `density` fraction, as mergekit's `magnitude_outliers`."""

from __future__ import annotations

from surgery.engine.ops.merge.magnitude import Magnitude
from surgery.engine.ops.merge.sparsify import Deltas, Sampled


class Breadcrumbs(Magnitude):
    """Keeps ascending ranks [n_bot, n_bot + int(density * n)), n_bot = n - kept - int(gamma * n)
    (at least 0: fewer outliers are dropped when density asks for more)."""

    def __init__(
        self,
        deltas: Deltas,
        numel: int,
        rescale: bool,
        density: float,
        sampled: Sampled,
        gamma: float,
    ) -> None:
        super().__init__(deltas, numel, rescale, density, sampled)
        self.gamma = gamma

    def keep_range(self) -> tuple[int, int]:
        """Ascending ranks kept."""
        target = int(self.density * self.numel)
        bottom = max(0, self.numel - target - int(self.gamma * self.numel))
        return bottom, bottom + target
