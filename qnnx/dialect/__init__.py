"""The ``qnnx`` ONNX operator domain: schemas and reference kernels.

Importing this package registers every op (see ``REGISTRY``).
"""

from qnnx.dialect import affine_ops, elementwise_ops, linear_ops, norm_ops  # noqa: F401  (registration)
from qnnx.dialect.schema import DOMAIN, REGISTRY, VERSION, OpSchema, get_schema

__all__ = ["DOMAIN", "VERSION", "REGISTRY", "OpSchema", "get_schema"]
