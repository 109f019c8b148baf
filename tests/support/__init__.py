"""Helpers that only tests and benchmarks use; the product package does not ship them."""
