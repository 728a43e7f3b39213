"""The pure domain: the conversation's shapes, edge bounds, and the rules the workflow applies.

Nothing here does I/O, reads a clock or draws randomness: workflow code imports it, and every rule is
tested as a plain function. It imports nothing else of Countersign.
"""
