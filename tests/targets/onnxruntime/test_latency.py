"""The ONNX Runtime timer's protocol: sessions in mirrored order, runs rotated (stand-in sessions)."""

from __future__ import annotations

from qnnx.targets.onnxruntime import latency


class _Session:
    def __init__(self, path: str, log: list):
        self.path, self.log = path, log

    def run(self, outputs, feed):
        self.log.append(self.path)


def test_every_model_gets_two_sessions_in_mirrored_order_and_runs_rotate(monkeypatch):
    created, runs = [], []

    def fake_session(path, threads=1, where=None):
        created.append(path)
        return _Session(path, runs)

    monkeypatch.setattr(latency.runtime, "session", fake_session)
    ms = latency.median_latency_ms(["f.onnx", "q.onnx"], feed={}, repeats=4, warmup=0)
    assert created == ["f.onnx", "q.onnx", "q.onnx", "f.onnx"]  # the same mean creation position
    assert set(ms) == {"f.onnx", "q.onnx"} and all(v >= 0 for v in ms.values())
    assert runs.count("f.onnx") == runs.count("q.onnx") == 8
    assert [runs[k * 4] for k in range(4)] == ["f.onnx", "q.onnx", "q.onnx", "f.onnx"]  # who leads rotates


def test_a_model_named_twice_is_timed_once(monkeypatch):
    monkeypatch.setattr(latency.runtime, "session", lambda path, threads=1, where=None: _Session(path, []))
    assert list(latency.median_latency_ms(["a.onnx", "a.onnx"], feed={}, repeats=2, warmup=0)) == ["a.onnx"]
