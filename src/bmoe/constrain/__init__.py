"""Constrain: what an answer may be (issue #36), as policy over text and token ids.

A JSON schema or a grammar becomes a constraint the sampler applies; a schema whose answers are a
finite set becomes a decision; the tool-call formats of the model families are one table with their
parsers. Nothing here imports the engine: the grammar sampler over a model's vocabulary is an
adapter in ``bmoe.llama``. ``__all__`` is what other packages may use.
"""

from bmoe.constrain.constraint import Constraint, constraint_of, from_response_format
from bmoe.constrain.mask import TokenMask
from bmoe.constrain.schema import MAX_ENUM, ConstraintError

__all__ = ["MAX_ENUM", "Constraint", "ConstraintError", "TokenMask", "constraint_of", "from_response_format"]
