"""Installed by the host when a command fails to import it."""

VALUE = "the extra package is here"
