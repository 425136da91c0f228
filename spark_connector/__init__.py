"""Spark's face of episub: topics as a Structured Streaming source and sink.

Not built yet; see the Spark connector issue. Nothing here is imported by `episub`.
"""
