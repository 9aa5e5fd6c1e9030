"""Pixels: image decode and resize to the patch grid, video frame sampling and decode."""
