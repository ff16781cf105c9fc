"""Benchmarks (`freshkey bench`): figures, not tests."""
