"""bmoe past one machine, on Ray (docs/scale-out.md).

``bmoe.ray.data``: decisions and generations over a Ray Dataset, one Session per actor.
``bmoe.ray.batch``: the ``bmoe-batch`` command over a JSONL file of protocol lines.
``bmoe.ray.flags``: the actor flags and the one-line Ray failure bmoe-batch and bmoe-eval share.
``bmoe.ray.serve``: bmoe-server's FastAPI app as a Ray Serve deployment.

Ray itself is imported only where it is used, so ``bmoe-batch`` without ``--ray`` runs without it.
"""
