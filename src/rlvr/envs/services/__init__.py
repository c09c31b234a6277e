"""Local services that environments call: the calculator, the Python sandbox, the search service."""
