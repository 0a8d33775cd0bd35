"""The evaluation harness."""
