"""A device mesh: ranks arranged on named axes (``dp`` data, ``pp`` pipeline, ``tp`` tensor).

Ranks are numbered with ``tp`` fastest, then ``pp``, then ``dp`` (Megatron's order: a tensor-parallel
group is neighbouring ranks, the group that talks most, on one host where possible)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import IRError

AXES = ("dp", "pp", "tp")


@dataclass(frozen=True)
class Mesh:
    dp: int = 1
    pp: int = 1
    tp: int = 1

    def __post_init__(self) -> None:
        for a in AXES:
            if int(getattr(self, a)) < 1:
                raise IRError(f"mesh axis {a}={getattr(self, a)} must be >= 1", fix="give positive sizes")

    @property
    def size(self) -> int:
        return math.prod(getattr(self, a) for a in AXES)

    def coords(self, rank: int) -> dict[str, int]:
        if not 0 <= rank < self.size:
            raise IRError(f"rank {rank} is outside a mesh of {self.size}", fix=f"use 0..{self.size - 1}")
        tp, rest = rank % self.tp, rank // self.tp
        return {"dp": rest // self.pp, "pp": rest % self.pp, "tp": tp}

    def rank(self, dp: int = 0, pp: int = 0, tp: int = 0) -> int:
        return (dp * self.pp + pp) * self.tp + tp

    def group(self, axis: str, rank: int) -> tuple[int, ...]:
        """The global ranks along ``axis`` through ``rank`` (the others' coordinates fixed)."""
        if axis not in AXES:
            raise IRError(f"unknown mesh axis {axis!r}", fix=f"use one of {AXES}")
        c = self.coords(rank)
        return tuple(self.rank(**{**c, axis: i}) for i in range(getattr(self, axis)))


__all__ = ["AXES", "Mesh"]
