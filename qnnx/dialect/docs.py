"""Render ``docs/dialect.md`` from the op registry (``python -m qnnx.dialect.docs > docs/dialect.md``).

A test checks the committed file is current, so the docs cannot drift from the schemas.
"""

from __future__ import annotations

from qnnx.dialect import DOMAIN, REGISTRY, VERSION

_HEADER = f"""# The `{DOMAIN}` dialect (ONNX domain `{DOMAIN}`, version {VERSION})

Generated from the op schemas in `qnnx/dialect/` by `python -m qnnx.dialect.docs`; do not edit by hand.

Conventions for every op:

- **qparams are inputs**, never attributes: scales are float tensors (float32, or float16 where the
  op says so), zero points are **int32** tensors whose values lie in the range of the tensor they
  describe. Each is a scalar (per-tensor) or 1-D along `axis` (per-axis) — output qparams included.
- Integer element types are explicit: ops producing integers carry `out_dtype`
  (`int2 uint2 int4 uint4 int8 uint8 int16 uint16 int32`).
- `rounding` says how ties round: `tflite` (gemmlowp double rounding in fixed point, away from
  zero in float), `upward` (toward +inf, TVM), `tonearest` (away from zero), `half_even`
  (ONNX QuantizeLinear). `compute` is `fixed_point` (Q31 multiplier + shift from `frexp`, exact int64
  products) or `float` (float32 multiplier). `qnnx.numerics` defines every step exactly.
- Bad qparams (zero, negative or non-finite scale; zero point outside its dtype; axis out of range;
  per-axis length not matching) are errors naming the node, never silently used.
"""


def _table(rows, head):
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def render() -> str:
    parts = [_HEADER]
    for name in sorted(REGISTRY):
        s = REGISTRY[name]
        parts.append(f"## `{DOMAIN}.{name}`\n\n{s.doc}\n")
        parts.append("**Inputs**\n\n" + _table(
            [(f"`{i.name}`" + (" (optional)" if i.optional else "") + (" (variadic)" if i.variadic else ""), i.doc)
             for i in s.inputs], ("name", "meaning")) + "\n")
        parts.append("**Outputs**\n\n" + _table([(f"`{o.name}`", o.doc) for o in s.outputs], ("name", "meaning")) + "\n")
        if s.attributes:
            rows = [(f"`{a.name}`", a.kind.__name__, "required" if a.required else f"`{a.default!r}`",
                     (a.doc + ("; one of " + ", ".join(f"`{c}`" for c in a.choices) if a.choices else "")))
                    for a in s.attributes]
            parts.append("**Attributes**\n\n" + _table(rows, ("name", "type", "default", "meaning")) + "\n")
        parts.append(f"**Types**: {s.types}\n")
    return "\n".join(parts)


if __name__ == "__main__":
    print(render(), end="")
