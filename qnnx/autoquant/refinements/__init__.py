"""Refinements: optional steps after realization, each ``state -> (state, record)`` (base.py)."""
