"""The store of kept sequence states (issue #37): keys, tiers (RAM, flash), eviction and the
longest kept prefix of a prompt, as policy. It drives the engine only through the sequence port
(``bmoe.decide.port.SequencePort``), which the llama adapter implements. ``__all__`` is what other
packages may use.
"""

__all__: list[str] = []
