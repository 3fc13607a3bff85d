"""The draftsmith command line and launch configs."""

__version__ = "0.1.0"
