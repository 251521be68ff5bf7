"""Bridges to other libraries (import the submodule you need; nothing heavy is imported here)."""
