"""Sphinx configuration of commlab's documentation (``make docs``: warnings are errors)."""
import os
import sys

sys.path.insert(0, os.path.abspath(".."))

project = "commlab"
author = "commlab developers"
copyright = "2026, commlab developers"
extensions = ["sphinx.ext.autodoc", "sphinx.ext.napoleon", "sphinx.ext.viewcode", "myst_parser"]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
exclude_patterns = ["_build"]
html_theme = "furo"
html_title = "commlab"

# numpydoc-style docstrings through napoleon; the API pages list members in source order
napoleon_google_docstring = False
napoleon_numpy_docstring = True
napoleon_use_rtype = False
napoleon_use_ivar = True
autodoc_member_order = "bysource"
autodoc_default_options = {"members": True, "show-inheritance": True}
# optional back ends the documentation does not need installed
autodoc_mock_imports = ["cupy", "torch", "jax", "sklearn"]
myst_heading_anchors = 3
suppress_warnings = ["myst.header"]
