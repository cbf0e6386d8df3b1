"""The ``evidence`` command (``main``) and its parser (``build_parser``)."""

from .main import build_parser, main

__all__ = ["build_parser", "main"]
