from pathlib import Path

from qnnx.dialect.docs import render


def test_dialect_docs_are_generated_from_the_current_schemas():
    committed = (Path(__file__).parents[2] / "docs" / "dialect.md").read_text()
    assert committed == render(), "regenerate: python -m qnnx.dialect.docs > docs/dialect.md"
