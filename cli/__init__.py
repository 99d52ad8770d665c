"""The ``terrain`` command line (click)."""
