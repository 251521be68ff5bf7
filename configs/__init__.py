"""The recipes' YAML configs, installed as package data under ``mmpe.configs``."""
