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


def _link_figures(app, doctree, docname):
    """Wrap every image of a page in a link to its full-size file: the theme shrinks a figure to the
    text column, where a wide one (the benchmark's six panels) cannot be read."""
    if app.builder.format != "html":
        return
    import posixpath

    from docutils import nodes
    from sphinx.util.osutil import relative_uri

    images = relative_uri(app.builder.get_target_uri(docname), "_images")
    for image in list(doctree.findall(nodes.image)):
        uri = image.get("candidates", {}).get("*", image["uri"])
        if isinstance(image.parent, nodes.reference) or uri not in app.env.images:
            continue
        link = nodes.reference("", "", internal=True, refuri=posixpath.join(images, app.env.images[uri][1]))
        image.replace_self(link)
        link.append(image)


def setup(app):
    app.connect("doctree-resolved", _link_figures)
