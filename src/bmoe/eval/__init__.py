"""bmoe-eval: decisions over a data set with gold answers, calibration metrics and a report
(docs/eval.md). ``metrics`` and ``temperature`` are pure; ``main`` is the command."""
