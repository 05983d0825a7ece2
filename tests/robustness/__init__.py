"""Robustness: property tests, fuzzing, hostile input."""
