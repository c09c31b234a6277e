"""What the tests share besides conftest: rigs that start real engines, tolerances derived from the
arithmetic they check, learning margins, and the small readers the tests use."""
