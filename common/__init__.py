"""The bottom layer every other package may import: errors, the version, file and hashing helpers, where draftsmith
keeps its files (``$DRAFTSMITH_HOME``: paths), model identity and loading. It imports no other draftsmith package
(docs/ARCHITECTURE.md)."""

__version__ = "0.1.0"
