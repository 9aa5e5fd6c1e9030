"""Recipes: what decides the data (datasets, operators, geometry, seed), the registry of
named recipes and TOML kinds, the text recipe and its bundled assets."""
