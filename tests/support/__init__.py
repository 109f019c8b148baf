"""Helpers that only tests use; the product package does not ship them (the bench's, which tests share, are in
bench/)."""
