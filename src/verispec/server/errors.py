"""Every error the server answers, as an OpenAI-style body with the right status, mapped once:

    {"error": {"message": "...", "type": "invalid_request_error", "param": "max_tokens", "code": null}}

Typed engine errors map by class (`from_engine_error`), request-validation errors by their field
path, HTTP routing errors by their status. Nothing answers with a traceback.
"""

from __future__ import annotations

from http import HTTPStatus

from verispec import errors as E

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error", 413: "invalid_request_error",
          503: "server_error"}


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None, type: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type or _TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


# engine error class -> (status, param, code); the first matching class wins (subclasses first)
_ENGINE_ERRORS: list[tuple[type[Exception], int, str | None, str | None]] = [
    (E.ContextLengthError, 400, "max_tokens", "context_length_exceeded"),
    (E.InvalidGrammarError, 400, None, "invalid_structured_output"),
    (E.InvalidSamplingParamsError, 400, None, None),
    (E.UnsupportedModelError, 400, None, "unsupported"),
    (E.InvalidPromptError, 400, "prompt", None),
    (E.ChatTemplateError, 400, "messages", None),
    (E.QueueFullError, 503, None, "queue_full"),
    (E.EngineNotReadyError, 503, None, "model_loading"),
    (E.ModelNotFoundError, 404, "model", "model_not_found"),
]


def from_engine_error(error: Exception) -> APIError:
    for cls, status, param, code in _ENGINE_ERRORS:
        if isinstance(error, cls):
            return APIError(status, str(error), param=param, code=code)
    return APIError(500, f"internal error: {type(error).__name__}", code="internal_error")


def from_validation_errors(errors: list[dict]) -> APIError:
    """FastAPI/pydantic validation errors -> one 400 naming the first offending field."""
    if not errors:
        return APIError(400, "invalid request body")
    first = errors[0]
    loc = [str(x) for x in first.get("loc", ()) if x != "body"]
    if first.get("type") == "json_invalid":
        return APIError(400, "the request body is not valid JSON", code="invalid_json")
    param = ".".join(loc) or None
    where = f" at {param}" if param else ""
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return APIError(400, f"{first.get('msg', 'invalid value')}{where}{more}", param=param)


def from_http_status(status: int, detail: str | None = None) -> APIError:
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        phrase = "error"
    return APIError(status, detail or phrase)
