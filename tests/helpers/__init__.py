"""Shared test helpers: recipe builders, run harnesses and crafted inputs."""
