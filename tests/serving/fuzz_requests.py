"""Hypothesis strategies for hostile HTTP requests to the gateway: any route of its router
table, any method, malformed or hostile headers and bodies.

Bodies mix JSON objects built from the API's own field names (so validation runs deep, not
just the "unknown field" check) with wrong types, huge and non-finite numbers, deep nesting,
invalid UTF-8, non-JSON and empty bodies. Nothing here knows a route's schema: a route added
to the gateway later is fuzzed with the same strategies.
"""

from __future__ import annotations

import json
import re
import string
import urllib.parse
from dataclasses import dataclass

from aiohttp import web
from hypothesis import strategies as st

METHODS = ("GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS")

# Field names the public API reads (chat, completions, RL routes), so generated objects reach
# the checks behind the "unrecognized argument" gate.
FIELDS = (
    "model",
    "messages",
    "prompt",
    "tools",
    "tool_choice",
    "temperature",
    "top_p",
    "top_k",
    "max_tokens",
    "max_completion_tokens",
    "stop",
    "seed",
    "stream",
    "stream_options",
    "logprobs",
    "top_logprobs",
    "n",
    "response_format",
    "logit_bias",
    "tenant",
    "task_id",
    "task",
    "reward",
    "interaction_id",
    "session_id",
    "source",
    "success",
    "info",
    "eligible_only",
    "include_open",
    "version",
    "path",
    "step",
    "user",
    "metadata",
    # the Responses API
    "input",
    "instructions",
    "previous_response_id",
    "max_output_tokens",
    "text",
    "reasoning",
    "reasoning_effort",
    "store",
)
ROLES = ("system", "developer", "user", "assistant", "tool", "function", "", "robot")


@dataclass(frozen=True)
class Route:
    method: str
    path: str  # aiohttp's canonical form: "/v1/models/{model}"


def gateway_routes(app: web.Application) -> list[Route]:
    """Every (method, path) the app's router serves (HEAD is implied by GET; skipped)."""
    routes = set()
    for route in app.router.routes():
        resource = route.resource
        if resource is None or route.method == "HEAD":
            continue
        routes.add(Route(route.method, resource.canonical))
    return sorted(routes, key=lambda r: (r.path, r.method))


# ----------------------------------------------------------------------------- JSON values

huge_ints = st.sampled_from([2**63, -(2**63) - 1, 2**64, 10**30, -(10**30), 10**308])
scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | huge_ints
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.sampled_from([0, -1, 1, 0.5, 1e308, -1e308, 5e-324])
    | st.text(max_size=40)
    | st.sampled_from(["", " ", "sao-test", "auto", "none", "user", "\x00", "\ud800"])
)
json_values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)
contents = (
    st.text(max_size=60)
    | st.lists(
        st.fixed_dictionaries(
            {"type": st.sampled_from(["text", "image_url", "", "x"])},
            optional={"text": json_values, "image_url": json_values},
        ),
        max_size=3,
    )
    | json_values
)
tool_calls = st.lists(
    st.fixed_dictionaries(
        {},
        optional={
            "id": json_values,
            "type": st.sampled_from(["function", "x"]) | json_values,
            "function": st.fixed_dictionaries(
                {}, optional={"name": st.text(max_size=10) | json_values, "arguments": json_values}
            )
            | json_values,
        },
    )
    | json_values,
    max_size=2,
)
messages = st.lists(
    st.fixed_dictionaries(
        {"role": st.sampled_from(ROLES) | json_values},
        optional={
            "content": contents,
            "tool_calls": tool_calls,
            "tool_call_id": st.text(max_size=8) | json_values,
            "name": json_values,
        },
    )
    | json_values,
    max_size=4,
)
tools = st.lists(
    st.fixed_dictionaries(
        {"type": st.just("function") | json_values},
        optional={
            "function": st.fixed_dictionaries(
                {"name": st.text(max_size=10) | json_values},
                optional={"parameters": json_values, "description": json_values},
            )
            | json_values
        },
    )
    | json_values,
    max_size=2,
)


def _api_object() -> st.SearchStrategy[dict]:
    """A JSON object of API fields with plausible-to-hostile values, sometimes near-valid."""
    plausible = {
        "model": st.just("sao-test") | json_values,
        "messages": messages,
        "prompt": st.text(max_size=40) | st.lists(st.integers(-5, 300), max_size=6) | json_values,
        "tools": tools,
        "max_tokens": st.integers(-2, 4) | json_values,  # small: valid calls stay quick
        "max_completion_tokens": st.integers(-2, 4) | json_values,
        "input": st.text(max_size=20) | messages | json_values,
        "max_output_tokens": st.integers(-2, 4) | json_values,
        "stream": st.booleans() | json_values,
        "reward": st.floats(allow_nan=True, allow_infinity=True) | json_values,
        "session_id": st.text(max_size=30) | json_values,
        "interaction_id": st.sampled_from(["chatcmpl-x-y", "a-b-c", "-", "--"]) | json_values,
        "tenant": st.sampled_from(["acme", "globex", "nope", "", "a/b", "../x"]) | json_values,
        "path": st.sampled_from(["", ".", "/", "/nonexistent", "gs://x/y", "\x00"]) | json_values,
        "version": st.integers(-(2**64), 2**64) | json_values,
    }
    short = ("max_tokens", "max_output_tokens")  # chat / Responses: valid calls stay quick
    required = st.fixed_dictionaries(
        {name: st.integers(1, 4) for name in short},
        optional={name: s for name, s in plausible.items() if name not in short},
    )
    loose = st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=8), json_values, max_size=6)
    return required | loose


# ----------------------------------------------------------------------------- raw bodies


def _encode(value) -> bytes:
    # allow_nan: NaN / Infinity tokens are what Python's own json.loads accepts; the
    # surrogatepass keeps lone surrogates (invalid UTF-8 in the body).
    text = json.dumps(value, allow_nan=True, ensure_ascii=False)
    return text.encode("utf-8", "surrogatepass")


# a chat body whose only user message has this content
CHAT = b'{"model": "sao-test", "max_tokens": 2, "messages": [{"role": "user", "content": %s}]}'
HOSTILE_CORPUS = (
    b"",
    b" ",
    b"null",
    b"[]",
    b'"text"',
    b"42",
    b"{",
    b'{"model": ',
    b'{"a": 1}{"b": 2}',
    b"\xff\xfe\x00{}",
    b'{"model": "\xc3\x28"}',  # invalid UTF-8 inside a string
    b"\xef\xbb\xbf{}",  # a UTF-8 byte-order mark
    b'{"reward": NaN}',
    b'{"reward": -Infinity}',
    b'{"max_tokens": 1e999}',
    b'{"seed": ' + b"9" * 5000 + b"}",  # past Python's int-conversion digit limit
    b'{"temperature": ' + b"1" * 400 + b".5}",
    b"[" * 100_000 + b"]" * 100_000,  # past Python's recursion limit
    b'{"a":' * 50_000 + b"1" + b"}" * 50_000,
    b'{"messages": [' + b'{"role": "user", "content": "x"},' * 5000 + b"1]}",
    b"\x00" * 64,
    b"model=sao-test&messages=hi",  # a form, not JSON
    # valid JSON whose strings are not valid Unicode text (lone surrogates, NUL)
    CHAT % b'"\\ud800"',
    CHAT % b'"a\\u0000b"',
    CHAT % b'[{"type": "text", "text": "\\udfff"}]',
    b'{"model": "sao-test", "max_tokens": 2, "prompt": "\\ud83d"}',
    b'{"model": "sao-test", "max_tokens": 2, "prompt": [999999999, -1]}',
    b'{"model": "sao-test", "max_tokens": 1099511627776, "prompt": "hi"}',
    b'{"tenant": "acme", "task": {"\\ud800": "\\udc00"}}',
    b'{"tenant": "acme", "task_id": "\\ud800"}',
    b'{"reward": 1, "session_id": "\\ud800", "source": "\\u0000"}',
    b'{"path": "\\u0000", "version": 1}',
    b'{"path": "/", "version": 18446744073709551616}',
    b'{"tenant": "acme", "eligible_only": true, "session_id": "\\ud800"}',
)
hostile_bodies = st.sampled_from(HOSTILE_CORPUS)


@st.composite
def deep_objects(draw) -> bytes:
    """An API object with one field nested `depth` levels: under Python's parser limit but
    deep enough to overflow any recursive walk behind it (validation, redaction, encoding)."""
    depth = draw(st.integers(20, 5000))
    field = draw(st.sampled_from(["task", "info", "metadata", "messages", "prompt", "tools"]))
    opener, closer = draw(st.sampled_from([("[", "]"), ('{"k":', "}")]))
    base = draw(_api_object())
    head = json.dumps({k: v for k, v in base.items() if k != field}, allow_nan=True)[:-1]
    sep = ", " if head != "{" else ""
    return f'{head}{sep}"{field}": {opener * depth}1{closer * depth}}}'.encode()


# One kind chosen uniformly first (one_of alone leans on its first, simplest branches).
bodies = st.sampled_from(
    [
        _api_object().map(_encode),
        _api_object().map(_encode),
        json_values.map(_encode),
        hostile_bodies,
        deep_objects(),
        st.binary(max_size=200),
        st.text(max_size=200).map(lambda t: t.encode("utf-8", "surrogatepass")),
    ]
).flatmap(lambda kind: kind)

# ----------------------------------------------------------------------------- headers

_TOKEN_CHARS = string.ascii_letters + string.digits + "-_"
header_values = st.text(
    alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=60
).map(str.strip)


def authorizations(principals: list[str]) -> st.SearchStrategy[str | None]:
    """An Authorization header template: none, a real key ("{admin}", "{session}", ... filled
    in when the request is sent, so a key replaced mid-run still works), malformed schemes and
    tokens, or garbage."""
    slot = st.sampled_from(principals).map(lambda name: "{" + name + "}")
    forms = st.sampled_from(
        ["Bearer {}", "bearer   {}", "Bearer {}x", "Basic {}", "Bearer{}", "Bearer {} {}"]
    )
    keyed = st.tuples(forms, slot).map(lambda fk: fk[0].replace("{}", fk[1]))
    garbage = header_values.map(lambda v: v.replace("{", "(").replace("}", ")"))
    real = slot.map(lambda key: f"Bearer {key}")
    stranger = st.just("Bearer sk-nobody-0123456789")  # well-formed, but nobody's key
    # mostly real keys: an unauthenticated request never reaches the body's validation
    return st.one_of(real, real, real, real, real, real, keyed, stranger, st.none(), garbage)


content_types = st.none() | st.sampled_from(
    [
        "application/json",
        "application/json; charset=latin-1",
        "application/json; charset=bogus",
        "text/plain",
        "multipart/form-data; boundary=x",
        "application/x-www-form-urlencoded",
        "",
    ]
)
extra_headers = st.dictionaries(
    st.text(alphabet=_TOKEN_CHARS, min_size=1, max_size=12).filter(
        # headers the client owns (framing, host) stay the client's: they are fuzzed at the
        # socket level in test_serving_hostile.py
        lambda name: (
            name.lower()
            not in {"content-length", "transfer-encoding", "host", "authorization", "content-type"}
        )
    ),
    header_values,
    max_size=3,
)

_PARAMETER = re.compile(r"\{[^}]+\}")


def fill_path(path: str) -> st.SearchStrategy[str]:
    """A concrete path for an aiohttp canonical path: each {name} a generated segment."""
    names = _PARAMETER.findall(path)
    if not names:
        return st.just(path)
    segment = st.sampled_from(["sao-test", "x", "..", "%00", "a" * 300]) | st.text(
        min_size=1, max_size=20
    ).map(lambda t: urllib.parse.quote(t, safe=""))

    def fill(parts: list[str]) -> str:
        segments = iter(parts)
        return _PARAMETER.sub(lambda _match: next(segments), path)

    return st.lists(segment, min_size=len(names), max_size=len(names)).map(fill)


unknown_paths = st.sampled_from(
    ["/", "/v1", "/v1/", "/v1/chat", "/rl/", "/rl/../v1/models", "//health", "/%2e%2e/health"]
) | st.text(alphabet=_TOKEN_CHARS + "/.%", max_size=40).map(lambda t: "/" + t)
