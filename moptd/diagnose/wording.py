"""How a value reads in a decision path and in `moptd explain`: one wording for both.

Apart from the engine so that the renderers import it without the engine (and with it the
expression compiler and the rule loader): `moptd explain` with the daemon up needs no rules.
"""

from __future__ import annotations


def fmt(v: object) -> str:
    if v is None:
        return "unknown"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)
