"""Every error the server answers has one JSON shape, the one OpenAI clients read:

    {"error": {"message": "...", "type": "...", "param": "<field or null>", "code": "..."}}

Schema violations keep FastAPI's status (422) and also carry FastAPI's ``detail`` list; their
message is "<field>: <rule>", the rule of the most specific error (``_rule``). A body that is not
JSON at all (bad syntax, bytes that are not UTF-8, nesting past the parser's depth, an integer past
Python's digit limit) is a 400 ``invalid_json`` saying which (``not_json``).
"""

from __future__ import annotations

import json
import sys
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from bmoe.errors import RequestError


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = headers or {}


def _type_for(status: int) -> str:
    if status in (401, 403):
        return "authentication_error"
    if status == 503:
        return "server_busy"
    if status >= 500:
        return "server_error"
    return "invalid_request_error"


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": _type_for(status), "param": param, "code": code}}


def error_response(e: ApiError) -> JSONResponse:
    return JSONResponse(error_body(e.status, e.message, e.param, e.code), status_code=e.status, headers=e.headers)


def from_request_error(e: RequestError, param: str | None) -> ApiError:
    """A session refusal (nothing in the session changed) as a 400."""
    code = "context_length_exceeded" if "context" in str(e) else "invalid_request"
    return ApiError(400, str(e), param, code)


def not_json(e: BaseException | None) -> str | None:
    """What made a body unreadable as JSON, in words, from the exception the parser raised; None
    for an exception that does not say the body is not JSON."""
    if isinstance(e, json.JSONDecodeError):
        return str(e)  # "Expecting value: line 1 column 8 (char 7)"
    if isinstance(e, UnicodeDecodeError):
        bad = e.object[e.start : e.start + 1].hex()
        return f"not {e.encoding.upper()} text (byte 0x{bad} at offset {e.start}: {e.reason})"
    if isinstance(e, RecursionError):
        return "its arrays and objects nest deeper than the parser goes"
    if isinstance(e, ValueError) and "digits" in str(e):  # int(): "Exceeds the limit (4300 digits) ..."
        return f"an integer of more than {sys.get_int_max_str_digits()} digits, more than Python reads"
    return None


def invalid_json(why: str) -> JSONResponse:
    return JSONResponse(error_body(400, f"body: not valid JSON: {why}", "body", "invalid_json"), status_code=400)


# Codes for the errors Starlette itself raises (an unknown path or method).
_HTTP_CODES = {404: "not_found", 405: "method_not_allowed"}


def _clean_loc(loc: tuple[Any, ...]) -> list[str]:
    """The field path without "body" and without the names pydantic gives union members
    ("DecideBody", "list[DecideBody]"); our field names are lower case."""
    return [str(p) for p in loc if p != "body" and not (isinstance(p, str) and (p[:1].isupper() or "[" in p))]


def _is_type_error(err: dict[str, Any]) -> bool:
    """pydantic's "<kind>_type" errors say the value is not of a type; in a union (a string or a
    list) one comes from every member the value is not, so another error is the one that matters."""
    return str(err.get("type", "")).endswith("_type")


def _rule(err: dict[str, Any]) -> str:
    """The error's rule in words; a list's length limit said as the limit, without pydantic's
    "List should have at most 16 items after validation, not 17"."""
    kind, ctx = err.get("type"), err.get("ctx") or {}
    got = f", got {ctx['actual_length']}" if ctx.get("actual_length") is not None else ""
    if kind == "too_long" and "max_length" in ctx:
        return f"at most {ctx['max_length']} items{got}"
    if kind == "too_short" and "min_length" in ctx:
        n = ctx["min_length"]
        return f"at least {n} item{'' if n == 1 else 's'}{got}"
    return str(err.get("msg", ""))


def install_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api(_: Request, e: ApiError) -> JSONResponse:
        return error_response(e)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, e: RequestValidationError) -> JSONResponse:
        ctype = request.headers.get("content-type", "")
        media = ctype.split(";")[0].strip().lower()
        if request.method == "POST" and media != "application/json" and not media.endswith("+json"):
            # FastAPI reads a body as JSON only when it says so; which also keeps other web
            # pages, which can send only form or text bodies without asking, from driving the model.
            return JSONResponse(
                error_body(
                    415,
                    f"the body must be JSON sent with Content-Type: application/json, got {ctype[:60]!r}",
                    "body",
                    "unsupported_media_type",
                ),
                415,
            )
        why = not_json(e.__cause__)  # FastAPI raises it from the parser's JSONDecodeError
        if why is not None:
            return invalid_json(why)
        # "input" and "ctx" can hold values that are not JSON (or are huge); the field and
        # the rule are what a client needs.
        detail = [
            {
                "loc": [str(p) for p in err.get("loc", ())],
                "msg": str(err.get("msg", "")),
                "type": str(err.get("type", "")),
            }
            for err in e.errors()
        ]
        # With a union (one decision or a list, a string or a list) the most specific error is
        # the deepest one, and at one depth one that is not "not this member's type".
        errors = e.errors()
        paths = [_clean_loc(tuple(err.get("loc", ()))) for err in errors]
        best = max(range(len(paths)), key=lambda i: (len(paths[i]), not _is_type_error(errors[i])), default=None)
        rule = _rule(errors[best]) if best is not None else "invalid request"
        param = ".".join(paths[best]) if best is not None and paths[best] else "body"
        body = error_body(422, f"{param}: {rule}", param, "validation_error")
        body["detail"] = detail
        return JSONResponse(body, status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, e: StarletteHTTPException) -> JSONResponse:
        # FastAPI's own "There was an error parsing the body" 400, raised from what the parser
        # raised: invalid UTF-8, too deep, too many digits
        why = not_json(e.__cause__) if e.status_code == 400 else None
        if why is not None:
            return invalid_json(why)
        return JSONResponse(
            error_body(e.status_code, str(e.detail), None, _HTTP_CODES.get(e.status_code)),
            status_code=e.status_code,
            headers=dict(e.headers or {}),
        )
