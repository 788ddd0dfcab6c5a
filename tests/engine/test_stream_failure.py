"""A file that changes under a streamed session stops it for good, with a clear error."""

import io
import json
import os
import re
import shutil
from pathlib import Path

import pytest

from bmoe.cli.loop import run_session
from bmoe.config import SessionConfig
from bmoe.errors import StreamFailedError
from bmoe.runtime.results import GenerateRequest
from bmoe.session import Session
from bmoe.stream.reader import StreamIOError


@pytest.fixture()
def streamed(tiny_models, tmp_path: Path):
    model = tmp_path / "m.gguf"
    shutil.copyfile(tiny_models("qwen3moe", "q4_k_m"), model)
    s = Session(SessionConfig(model=model, moe_stream=True, twin_dir=tmp_path / "twins", n_ctx=128, n_threads=1))
    yield s, model
    s.close()


def test_changed_file_is_a_sticky_error(streamed) -> None:
    s, model = streamed
    assert s.generate(GenerateRequest(prompt="Hi", n_predict=4)).n_tokens == 4
    st = model.stat()
    os.utime(model, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # "replaced" under the session
    with pytest.raises(
        StreamFailedError, match=r"^expert streaming failed: .*this session cannot continue, open a new one$"
    ):
        s.generate(GenerateRequest(prompt="Hi", n_predict=4))
    with pytest.raises(StreamFailedError):  # sticky: nothing runs on a broken session
        s.perplexity("some text here")


def test_session_loop_reports_it_as_fatal(streamed) -> None:
    s, model = streamed
    st = model.stat()
    os.utime(model, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    out = io.StringIO()
    lines = [json.dumps({"cmd": "generate", "id": 3, "prompt": "Hi", "n_predict": 2}), json.dumps({"cmd": "stats"})]
    assert run_session(s, io.StringIO("\n".join(lines) + "\n"), out) == 1
    last = out.getvalue().splitlines()[-1]
    assert last.startswith("BMOE_ERROR ") and json.loads(last[len("BMOE_ERROR ") :])["fatal"] is True


def test_a_read_failing_behind_a_wait_point_is_the_same_sticky_error(tiny_models, tmp_path: Path) -> None:
    """With split-phase reads a down read can fail after its route returned; the error comes out
    at the wait before the down matmul and must end the session exactly like any other."""
    from bmoe.stream.reader import StreamIOError

    s = Session(
        SessionConfig(
            model=tiny_models("qwen3moe", "q8_0"),
            moe_stream=True,
            io_threads=1,
            twin_dir=tmp_path / "twins",
            n_ctx=128,
            n_threads=1,
        )
    )
    try:
        assert s.generate(GenerateRequest(prompt="Hi", n_predict=4)).n_tokens == 4  # learns the graph
        hook, streamer = s.streaming.hook, s.streaming.streamer
        down = streamer.cache._buffers[(0, "ffn_down_exps")].window
        read_one = streamer.reader._read_one

        def failing(op):  # noqa: ANN001, ANN202
            if op.window is down:
                raise StreamIOError("injected: down read failed")
            return read_one(op)

        streamer.reader._read_one = failing
        routes, waits = hook.n_routes, hook.n_stop_waits
        with pytest.raises(
            StreamFailedError,
            match=r"^expert streaming failed: injected: down read failed; "
            r"this session cannot continue, open a new one$",
        ):
            s.generate(GenerateRequest(prompt="Hi", n_predict=4))
        # One lane: gate and up were read before the failure, so the route returned and the
        # error came out at the down projection's wait point, before its matmul.
        assert hook.n_routes == routes + 1 and hook.n_stop_waits == waits
        assert streamer.pending == () and isinstance(hook.error, StreamIOError)
        with pytest.raises(StreamFailedError, match="injected"):  # sticky
            s.generate(GenerateRequest(prompt="Hi", n_predict=1))
    finally:
        s.close()


def test_a_failed_prefetch_read_is_the_same_sticky_error(tiny_models, tmp_path: Path) -> None:
    """--prefetch: a read queued on a guess fails (here: it points past the end of the file). The
    route that takes the guess over must not let a matmul read the buffer; the error ends the
    session like any other and nothing is left in flight."""
    from bmoe.stream.reader import ReadOp

    s = Session(
        SessionConfig(
            model=tiny_models("qwen3moe", "q8_0"),
            moe_stream=True,
            prefetch=True,
            io_threads=1,
            twin_dir=tmp_path / "twins",
            n_ctx=128,
            n_threads=1,
        )
    )
    try:
        assert s.generate(GenerateRequest(prompt="Hi", n_predict=4)).n_tokens == 4
        hook, streamer = s.streaming.hook, s.streaming.streamer
        assert hook.n_prefetches > 0
        reader, submit, prefetch = streamer.reader, streamer.reader.submit, streamer.prefetch
        end = reader.files[0].size
        guessing = []

        def bad_submit(groups, **kw):  # noqa: ANN001, ANN202
            if guessing:  # the guess's reads land past the end of the file: they fail
                groups = [[ReadOp(op.file_index, end + 4096, op.nbytes, op.window, op.at) for op in g] for g in groups]
            return submit(groups, **kw)

        def failing_prefetch(il, ids, **kw):  # noqa: ANN001, ANN202
            guessing.append(il)
            try:
                prefetch(il, ids, **kw)
            finally:
                guessing.clear()

        reader.submit, streamer.prefetch = bad_submit, failing_prefetch
        with pytest.raises(
            StreamFailedError,
            match=r"^expert streaming failed: .* ended at offset .*"
            r"this session cannot continue, open a new one$",
        ):
            s.generate(GenerateRequest(prompt="Hi", n_predict=4))
        assert streamer.pending == () and streamer.prefetching is None and isinstance(hook.error, StreamIOError)
        with pytest.raises(StreamFailedError, match="ended at offset"):  # sticky
            s.generate(GenerateRequest(prompt="Hi", n_predict=1))
    finally:
        s.close()


def test_an_interrupt_inside_the_hook_ends_the_session_with_a_clear_error(streamed) -> None:
    """A KeyboardInterrupt (Ctrl-C on the main thread) that lands in the hook's C callback, here
    in the streamer's route, is kept as a HookError: the session's sticky failure, saying it must
    be reopened. Before, the raw KeyboardInterrupt stayed in the hook and came back from every
    later request, while the session claimed to be usable."""
    from bmoe.llama.expert_hook import HookError

    s, _ = streamed
    assert s.generate(GenerateRequest(prompt="Hi", n_predict=2)).n_tokens == 2
    hook, streamer = s.streaming.hook, s.streaming.streamer
    on_route = streamer.on_route
    calls = []

    def interrupted(il, ids):  # noqa: ANN001, ANN202
        calls.append(il)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return on_route(il, ids)

    streamer.on_route = interrupted
    msg = (
        r"^expert streaming failed: the streaming hook was interrupted inside llama_decode \(KeyboardInterrupt\); "
        r"the expert cache may be half-updated; this session cannot continue, open a new one$"
    )

    def raised(call) -> BaseException:  # noqa: ANN001
        try:  # a raw KeyboardInterrupt must fail this test, not stop the whole pytest run
            call()
        except BaseException as e:  # noqa: BLE001
            return e
        raise AssertionError("nothing was raised")

    first = raised(lambda: s.generate(GenerateRequest(prompt="Hi", n_predict=4)))
    assert isinstance(first, StreamFailedError) and re.match(msg, str(first)), repr(first)
    assert isinstance(first.__cause__, HookError) and isinstance(first.__cause__.__cause__, KeyboardInterrupt)
    assert isinstance(hook.error, HookError) and streamer.pending == ()
    assert s.kv.tokens == []  # the failed decode's bookkeeping was reset, not left half-updated
    streamer.on_route = on_route
    for later in (lambda: s.generate(GenerateRequest(prompt="Hi", n_predict=1)), lambda: s.perplexity("some text")):
        e = raised(later)  # sticky, and the same clear message
        assert isinstance(e, StreamFailedError) and re.match(msg, str(e)), repr(e)
