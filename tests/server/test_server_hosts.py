"""The Host-header allow-list: a page on another site that rebinds its own DNS name to this machine
(DNS rebinding) sends its own name as Host, so only the names this server is reached by are
answered; every other request gets a 400 naming the host, before auth, validation or the queue."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from bmoe.server import ServerSettings
from helpers.server import label_sets, metric

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
ROUTES = (
    ("get", "/health", None),
    ("get", "/", None),
    ("get", "/v1/models", None),
    ("get", "/metrics", None),
    ("post", "/v1/chat/completions", CHAT),
    ("post", "/v1/decide", {"choices": ["A", "B"]}),
)


def refused(r, host: str) -> None:
    assert r.status_code == 400, r.text
    e = r.json()["error"]
    assert e["code"] == "host_not_allowed" and e["type"] == "invalid_request_error"
    assert e["message"] == (
        f"Host {host!r} is not allowed: bmoe-server answers only localhost, loopback "
        f"addresses, its --host and the names in --allowed-hosts"
    )


@pytest.mark.parametrize(
    "host",
    [
        "localhost",
        "localhost:8080",
        "LocalHost:1",
        "localhost.",
        "127.0.0.1",
        "127.0.0.1:8080",
        "127.0.0.2:80",
        "[::1]",
        "[::1]:8080",
    ],
)
def test_local_names_are_answered_by_default(make_app, tiny_path, host) -> None:
    with TestClient(make_app(tiny_path), base_url="http://localhost") as c:
        r = c.get("/health", headers={"Host": host})
        assert r.status_code == 200, (host, r.text)


@pytest.mark.parametrize(
    "host",
    [
        "evil.example",
        "evil.example:8080",
        "localhost.evil.example",
        "127.0.0.1.nip.io",
        "0.0.0.0:8080",
        "192.168.1.5",
        "[::2]:8080",
        "[::1",
        "localhost:80:80",
        "",
        "testserver",
    ],
)
def test_other_hosts_are_refused_on_every_route(make_app, tiny_path, host) -> None:
    app = make_app(tiny_path)
    with TestClient(app, base_url="http://localhost") as c:
        for method, path, body in ROUTES:
            refused(c.request(method, path, json=body, headers={"Host": host}), host)
        assert app.state.queue.last_stats["n_past"] == 0  # nothing reached the session
        m = c.get("/metrics", headers={"Host": "localhost"}).text
        assert metric(m, "bmoe_http_requests_total", route="/v1/chat/completions", status="400") == 1
        assert label_sets(m, "bmoe_chat_completions_total") == []


def test_a_long_host_is_cut_in_the_message(make_app, tiny_path) -> None:
    with TestClient(make_app(tiny_path), base_url="http://localhost") as c:
        r = c.get("/health", headers={"Host": "a" * 500 + ".example"})
        assert r.status_code == 400 and len(r.json()["error"]["message"]) < 250


def test_the_allow_list_comes_before_the_api_key(make_app, tiny_path) -> None:
    with TestClient(make_app(tiny_path, ServerSettings(api_key="k")), base_url="http://localhost") as c:
        r = c.get("/v1/models", headers={"Host": "evil.example", "Authorization": "Bearer k"})
        refused(r, "evil.example")
        assert c.get("/v1/models", headers={"Host": "localhost", "Authorization": "Bearer k"}).status_code == 200


def test_added_names_and_addresses(make_app, tiny_path) -> None:
    app = make_app(tiny_path, ServerSettings(allowed_hosts=("bmoe.lan", "192.168.1.5", "fe80::1")))
    with TestClient(app, base_url="http://localhost") as c:
        for host in ("bmoe.lan", "BMOE.LAN:8080", "192.168.1.5:8080", "[fe80::1]:8080", "localhost:9"):
            assert c.get("/health", headers={"Host": host}).status_code == 200, host
        refused(c.get("/health", headers={"Host": "other.lan"}), "other.lan")


def test_a_star_answers_every_host(make_app, tiny_path) -> None:
    with TestClient(make_app(tiny_path, ServerSettings(allowed_hosts=("*",))), base_url="http://localhost") as c:
        for host in ("evil.example", "anything:1", ""):
            assert c.get("/health", headers={"Host": host}).status_code == 200, host


@pytest.mark.parametrize(
    "argv, expected",
    [
        ([], ()),  # localhost and loopback addresses are always answered
        (["--host", "127.0.0.1"], ()),
        (["--host", "192.168.1.5"], ("192.168.1.5",)),
        (
            ["--host", "bmoe.lan", "--allowed-hosts", "a.lan, [FE80::0001] ,B.lan."],
            ("bmoe.lan", "a.lan", "fe80::1", "b.lan"),
        ),
        (["--host", "0.0.0.0"], ()),  # every address: none of them is its name
        (["--host", "::", "--allowed-hosts", "*"], ("*",)),
    ],
)
def test_the_allowed_hosts_flag(argv, expected) -> None:
    from bmoe.server.main import allowed_hosts, build_server_parser

    assert allowed_hosts(build_server_parser().parse_args(argv)) == expected


@pytest.mark.parametrize("value", ["", ",", "a.lan,,b.lan", "a.lan:8080", "http://a.lan", "a lan"])
def test_bad_allowed_hosts_are_refused(value, capsys) -> None:
    from bmoe.server.main import main

    with pytest.raises(SystemExit) as e:
        main(["--allowed-hosts", value])
    assert e.value.code == 2 and "bmoe-server: error: --allowed-hosts: " in capsys.readouterr().err
