"""The surfaces users meet: the command line, its rendering and the SDK."""
