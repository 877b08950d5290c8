"""Wire contracts: msgspec schemas and pure codecs, with no I/O and no engine."""
