"""The product side: evaluation harness, reports and plots, the ``ccpo`` CLI and runtime."""
