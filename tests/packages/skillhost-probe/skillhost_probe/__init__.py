"""A package the install tests install from a local index."""


def greet():
    return "hello from the probe"
