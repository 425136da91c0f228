"""The trio runtime that carries the core's outputs over TCP (the runtime issue).

Empty until then; it exists now so the layering contracts can name it.
"""
