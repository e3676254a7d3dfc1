"""Fixtures shared by unit and integration tests."""
