"""bmoe.image_refs: the one parser of image references the server and the session share."""

from __future__ import annotations

import base64

import pytest

from bmoe.image_refs import ImageError, image_bytes, kind

PNG = b"\x89PNG\r\n\x1a\nrest"
URL = "data:image/png;base64," + base64.b64encode(PNG).decode()


@pytest.mark.parametrize(
    "source, want",
    [
        ("data:image/png;base64,AAAA", "data"),
        ("DATA:image/png;base64,AAAA", "data"),
        ("DaTa:/../x.png", "data"),
        ("https://example.com/a.png", "url"),
        ("HTTP://x/a.png", "url"),
        ("file:///etc/passwd", "url"),
        ("screen.png", "path"),
        ("/tmp/a:b.png", "path"),
        ("./DATA/x.png", "path"),
    ],
)
def test_kind_reads_the_scheme_in_any_case(source: str, want: str) -> None:
    assert kind(source) == want


def test_a_data_url_decodes_in_any_case_and_bytes_pass_through() -> None:
    assert image_bytes(URL, "images[0]", paths=False) == PNG
    assert image_bytes(URL.replace("data:image/png;base64", "DATA:IMAGE/PNG;BASE64"), "images[0]", paths=False) == PNG
    assert image_bytes(PNG, "images[0]", paths=False) == PNG


@pytest.mark.parametrize(
    "source, code, words",
    [
        ("DATA:/../secret.png", "bad_data_url", "images[0] is a data: URL that is not base64"),
        ("data:image/png;base64,@@", "bad_data_url", "images[0] is a data: URL whose base64 does not decode"),
        ("https://example.com/a.png", "remote_image_url", "images[0] is a remote URL; bmoe does no network fetches"),
        ("/etc/passwd", "image_not_inline", "images[0] is not a data: URL; the server reads no files"),
        ("/no/such/file.png", "image_not_inline", "images[0] is not a data: URL; the server reads no files"),
    ],
)
def test_without_paths_nothing_is_opened(source: str, code: str, words: str, monkeypatch) -> None:
    import pathlib

    def no_io(*a, **k):  # type: ignore[no-untyped-def]
        raise AssertionError("a path was looked at")

    for name in ("is_dir", "is_file", "read_bytes", "exists", "stat"):
        monkeypatch.setattr(pathlib.Path, name, no_io)
    with pytest.raises(ImageError) as e:
        image_bytes(source, "images[0]", paths=False)
    assert e.value.code == code and str(e.value).startswith(words)


def test_with_paths_a_file_is_read(tmp_path) -> None:
    (tmp_path / "a.png").write_bytes(PNG)
    assert image_bytes(str(tmp_path / "a.png"), "images[0]", paths=True) == PNG
    with pytest.raises(ImageError, match="file not found"):
        image_bytes(str(tmp_path / "b.png"), "images[0]", paths=True)
    with pytest.raises(ImageError, match="is a folder"):
        image_bytes(str(tmp_path), "images[0]", paths=True)
