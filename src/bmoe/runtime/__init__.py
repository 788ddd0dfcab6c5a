"""One loaded model and everything that computes with it: model, context, KV bookkeeping, chat
rendering, streaming wiring, sampling, the text stream, perplexity, the decide adapter and the
typed results. The Session (bmoe.session) adds the lock, cancel and sticky failure on top."""
