"""Decide: pick one of a fixed list of choices from one prefill, with the prefix state kept.

This package is policy over token ids and one logit row; it imports nothing of the engine.
``DecideService`` (service.py) is a session's decide: debiasing around a ``Decider`` (decider.py),
which drives the engine only through the two ports of ``port.py`` (text, sequence);
``bmoe.runtime.decide`` holds their adapters over a loaded model; nothing here imports it.

``__all__`` is what other packages may use (tests/unit/test_public_door.py holds them to it): the
request and result records, the request's field table and builder (``fields``), the refusals
(``errors``), the engine ports the adapters implement (``port``), the kept states' store as the decider sees it
(``kept_prefix``, which ``bmoe.state_store`` implements), the decider and the service, and the
whole-choice scores of a choice tree (``full_scores``, ``token_logps``: the tool-name decision of a
generation turn scores its choices with them). Everything else is the policy's own.
"""

from bmoe.decide import errors, fields, kept_prefix, port
from bmoe.decide.debias import NoPriorError, decisions_needed
from bmoe.decide.decider import DecidePolicy, Decider
from bmoe.decide.fields import DECIDE_TABLE, RENDER_TABLE, decide_request, request_fields
from bmoe.decide.kept_prefix import resolve_keep_prefix
from bmoe.decide.scoring_modes import full_scores, token_logps
from bmoe.decide.service import DecideService
from bmoe.decide.types import ChoiceScores, DebiasScores, DecideRequest, DecideResult, RenderRule

__all__ = [
    "DECIDE_TABLE",
    "RENDER_TABLE",
    "ChoiceScores",
    "DebiasScores",
    "DecidePolicy",
    "Decider",
    "DecideRequest",
    "DecideResult",
    "DecideService",
    "NoPriorError",
    "RenderRule",
    "decide_request",
    "decisions_needed",
    "errors",
    "fields",
    "full_scores",
    "kept_prefix",
    "port",
    "request_fields",
    "resolve_keep_prefix",
    "token_logps",
]
