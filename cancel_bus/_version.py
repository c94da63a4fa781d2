"""The package version (one place)."""

VERSION = "0.1.0"
