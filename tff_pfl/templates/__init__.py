"""Reusable TensorFlow pieces that algorithms compose."""
