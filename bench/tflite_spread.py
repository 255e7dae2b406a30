"""How far LiteRT's optimized kernels and XNNPACK are from its reference kernels on the TFLite test
models (tests/data/tflite): max |difference| in LSB and the share of differing elements per output,
over the stored samples. qnnx reproduces the reference kernels (tests/frontends/test_tflite_models.py).

    python bench/tflite_spread.py            # a markdown table (docs/benchmarks.md)
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from ai_edge_litert.interpreter import Interpreter, OpResolverType

DATA = Path(__file__).parent.parent / "tests" / "data" / "tflite"
RESOLVERS = {"optimized": OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES, "xnnpack": OpResolverType.BUILTIN}


def quanta(path: Path) -> list[float]:
    """Per output, the size of one LSB: 1 for integer outputs, the input scale of the DEQUANTIZE
    producing a float output."""
    from qnnx.frontends.tflite.reader import read

    m = read(path)
    producer = {o: op for op in m.operators for o in op.outputs}
    sizes = []
    for i in m.outputs:
        op = producer.get(i)
        q = m.tensors[op.inputs[0]].qparams if op is not None and op.opcode == "DEQUANTIZE" else None
        sizes.append(float(q.scale[0]) if m.tensors[i].dtype == "FLOAT32" and q is not None else 1.0)
    return sizes


def outputs(path: Path, x: np.ndarray, resolver) -> list[np.ndarray]:
    it = Interpreter(model_path=str(path), experimental_op_resolver_type=resolver, num_threads=1)
    it.allocate_tensors()
    it.set_tensor(it.get_input_details()[0]["index"], x)
    it.invoke()
    return [it.get_tensor(d["index"]).astype(np.float64) for d in it.get_output_details()]


def main() -> None:
    print("| model | output | optimized: max LSB (differing) | XNNPACK: max LSB (differing) |")
    print("|---|---|---|---|")
    for path in sorted(DATA.glob("*.tflite")):
        z = np.load(path.with_suffix(".npz"))
        inputs = [z[k] for k in sorted(f for f in z.files if f.startswith("input_"))]
        ref = [outputs(path, x, OpResolverType.BUILTIN_REF) for x in inputs]
        lsb = quanta(path)
        cells = {}
        for label, resolver in RESOLVERS.items():
            got = [outputs(path, x, resolver) for x in inputs]
            for j in range(len(ref[0])):
                diff = np.rint(np.concatenate([np.abs(g[j] - r[j]).ravel() for g, r in zip(got, ref)]) / lsb[j])
                cells.setdefault(j, []).append(f"{int(diff.max())} ({100 * np.mean(diff > 0):.1f}%)")
        for j, (a, b) in cells.items():
            print(f"| {path.stem} | {j} | {a} | {b} |")


if __name__ == "__main__":
    main()
