"""Shared data for the search-layer tests: the real templates, dtype sets and matrix shapes."""

from evo.templates.template import load_templates
from ops.rmsnorm.spec import matrix

TEMPLATES = load_templates("rmsnorm")
ARCH = 90
BF16 = {"x": "bfloat16", "w": "bfloat16"}
FP16 = {"x": "float16", "w": "float16"}
FP32 = {"x": "float32", "w": "float32"}
DTYPE_SETS = {"bf16": [BF16], "fp16": [FP16], "fp32": [FP32], "all": [BF16, FP16, FP32]}
CELLS = matrix()
DIMS = list({tuple(c.dims_dict().items()): c.dims_dict() for c in CELLS}.values())  # 12 distinct shapes
CASES = [(t, d) for t in TEMPLATES for d in DTYPE_SETS]
CASE_IDS = [f"{t}-{d}" for t, d in CASES]
