"""The store of kept sequence states (issue #37): keys, tiers (RAM, flash), eviction and the
longest kept prefix of a prompt, as policy. It drives the engine only through the sequence port
(``bmoe.decide.port.SequencePort``), which the llama adapter implements; the decider sees it as
``bmoe.decide.kept_prefix.PrefixStore``. ``__all__`` is what other packages may use.
"""

from bmoe.state_store.disk import DiskTier
from bmoe.state_store.keys import ModelIdentity
from bmoe.state_store.store import StateStore, StoreCounts

__all__ = ["DiskTier", "ModelIdentity", "StateStore", "StoreCounts"]
