"""The version of the zephon-vl distribution, in one place.

setuptools reads it when it builds the wheel (pyproject.toml's dynamic version, parsed
without importing zephon_core) and both packages report it at run time
(``zephon_core.__version__``, ``zephon_vl.__version__``). A file rather than
``importlib.metadata`` so that a source checkout on ``sys.path`` or an editable install
whose metadata was written by an older version still reports the version of the code
that runs. Bump it with a CHANGELOG.md section of the same number.
"""

__version__ = "0.4.0"
