"""``rlvr serve``: the OpenAI-compatible app, the model host behind it, and the server process launcher."""
