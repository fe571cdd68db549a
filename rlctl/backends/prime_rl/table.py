"""`[backend.prime_rl]`: the recipe table of the prime-rl adapter (a pydantic model, imported only where recipes are
read: rlctl.backends.base.LazyTable)."""

from __future__ import annotations

from pydantic import Field

from rlctl.recipe.schema import BackendExtra


class PrimeRLTable(BackendExtra):
    """`[backend.prime_rl]`: the escape hatch plus where prime-rl is checked out."""

    checkout: str | None = Field(
        default=None, description="The prime-rl checkout (a uv project) that runs the job; default: $PRIME_RL_DIR.")
