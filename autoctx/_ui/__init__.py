"""The audit console (`autoctx ui`): a local, read-only web page over autoctx's store.

`timeline` draws the token timeline (pure: numbers in, SVG text out); `app` serves the pages
with the standard library's threaded HTTP server and Jinja2 templates (autoescaped: every
message is untrusted agent text).
"""
