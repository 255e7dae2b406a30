"""The OpenVINO timer's protocol (no OpenVINO needed: the compiled models are stand-ins)."""

from __future__ import annotations

import pytest

from qnnx.targets.openvino import runtime


class _Compiled:
    def __init__(self, name: str, log: list):
        self.name, self.log = name, log

    def create_infer_request(self):
        return self

    def infer(self, feed):
        self.log.append(self.name)


def test_every_model_is_compiled_twice_in_mirrored_order_and_run_in_rotated_order(monkeypatch):
    compiled, runs = [], []

    def fake_compile(model, *, threads=1, precision="default"):
        compiled.append(model)
        return _Compiled(model, runs)

    monkeypatch.setattr(runtime, "compile_model", fake_compile)
    ms = runtime.median_latency_ms(["a", "b", "c"], feed={}, repeats=6, warmup=0)
    assert compiled == ["a", "b", "c", "c", "b", "a"]  # the same mean compile position for each
    assert len(ms) == 3 and all(m >= 0 for m in ms)
    assert runs.count("a") == runs.count("b") == runs.count("c") == 12  # both copies, every repeat
    firsts = [runs[k * 6] for k in range(6)]
    assert firsts == ["a", "b", "c", "c", "b", "a"]  # each copy leads a round once: no model always first


@pytest.mark.openvino
def test_timing_a_model_openvino_cannot_read_is_one_error_line():
    pytest.importorskip("openvino")
    from qnnx.errors import QnnxError

    with pytest.raises(QnnxError, match="OpenVINO cannot compile the model"):
        runtime.median_latency_ms(["/nonexistent/model.onnx"], feed={}, repeats=1)


@pytest.mark.openvino
def test_a_model_openvino_cannot_convert_is_one_error_line_naming_why(tmp_path):
    pytest.importorskip("openvino")
    import onnx
    from onnx import helper

    from qnnx.errors import QnnxError

    graph = helper.make_graph([helper.make_node("FooBar", ["x"], ["y"], domain="weird")], "g",
                              [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])])
    path = tmp_path / "unknown_op.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("weird", 1)]),
              path)
    with pytest.raises(QnnxError, match="No conversion rule found for operations: weird.FooBar") as e:
        runtime.compile_model(path)
    assert "\n" not in str(e.value)
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"not a model")
    with pytest.raises(QnnxError, match="OpenVINO cannot compile the model") as e:
        runtime.compile_model(garbage)
    assert "\n" not in str(e.value)


@pytest.mark.openvino
@pytest.mark.realmodel
def test_an_onnx_model_is_compiled_as_openvino_convert_model_converts_it(tmp_path):
    """PP-OCR cls quantized for OpenVINO: compiled from the ONNX file directly, the plugin keeps layers
    apart that the converter's transformations fuse (a deployment converts the file, and NNCF's models are
    converted): qnnx compiles what the converter makes."""
    ov = pytest.importorskip("openvino")
    pytest.importorskip("rapidocr_onnxruntime", reason="needs the examples extra")
    import collections

    import qnnx
    from qnnx import QuantConfig
    from qnnx.examples.ppocr_cls import crops, load_classifier
    from qnnx.targets.openvino.execution_check import executed_layers

    classifier = load_classifier()
    calib, _ = crops(classifier, 8, seed=0, split=0)
    qm = qnnx.quantize(str(classifier.path), [{classifier.input_name: x} for x in calib],
                       config=QuantConfig(progress=False, target="openvino", weight_rounding="nearest",
                                          bias_correction="off", speed_fallback="off"))
    path = tmp_path / "cls.ov.onnx"
    qm.save(path)

    def layers(compiled) -> collections.Counter:
        return collections.Counter(layer.layer_type for layer in executed_layers(compiled))

    core, config = ov.Core(), {"INFERENCE_NUM_THREADS": "1"}
    converted = layers(core.compile_model(ov.convert_model(str(path)), "CPU", config))
    read = layers(core.compile_model(core.read_model(str(path)), "CPU", config))
    assert read != converted, "this OpenVINO compiles the file alike either way: the test no longer tells them apart"
    assert layers(runtime.compile_model(path)) == converted
