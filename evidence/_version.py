"""The package's version, in a module of its own.

Everything that names the version (``evidence --version``, the writer service's welcome,
the public ``evidence.__version__``) imports it from here, the lowest floor of the house:
naming it imports nothing else of the package, and no module has to import the package's
public face (which imports, lazily, nearly all of it) to learn it. pyproject.toml states the
same version (``tests/test_layering.py`` checks the two agree).
"""

__all__ = ["__version__"]

__version__ = "0.1.0"
