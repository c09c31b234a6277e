"""Single-turn graders: exact match, math-verify, and the adapter for the ``verifiers`` package.

Named ``graders`` rather than ``verifiers`` so that nothing here can be mistaken for (or shadow) the
``verifiers`` package the adapter wraps.
"""
