"""Secrets of every kind in the redaction catalogue: fixed cases with near misses, and
hypothesis strategies that plant fresh ones (for the tests of `atdp_io.redaction`).

A `Planted` secret is the text a user would send plus its `cores`: the substrings that must not
survive anywhere (a PEM block's base64 lines, an IBAN in compact and spaced form); scanning for
the cores and not the whole text also catches a partial redaction.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import string

from hypothesis import strategies as st

from atdp_io.secret_catalogue import IBAN_LENGTHS, iban_mod97, luhn_ok


@dataclasses.dataclass(frozen=True)
class Planted:
    kind: str
    text: str
    cores: tuple[str, ...]


# (kind, label, positive text, cores, near miss that must be left exactly as it is)
PEM_BODY = base64.b64encode(bytes(range(7, 7 + 150))).decode()
PEM_LINES = [PEM_BODY[i : i + 64] for i in range(0, len(PEM_BODY), 64)]


def pem(label: str, newline: str = "\n", lines: list[str] = PEM_LINES, end: bool = True) -> str:
    block = [f"-----BEGIN {label}-----", *lines]
    if end:
        block.append(f"-----END {label}-----")
    return newline.join(block) + newline


AWS_KEY = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
GIT_SHA = "c3311fe0d1a9b7e5f4c2a8b6d0e9f1a2b3c4d5e6"

CASES = [
    ("private_key", "rsa", pem("RSA PRIVATE KEY"), PEM_LINES, pem("PUBLIC KEY")),
    ("private_key", "ec", pem("EC PRIVATE KEY"), PEM_LINES, pem("CERTIFICATE")),
    ("private_key", "openssh", pem("OPENSSH PRIVATE KEY"), PEM_LINES, pem("RSA PUBLIC KEY")),
    ("private_key", "pkcs8", pem("PRIVATE KEY"), PEM_LINES, "ssh-rsa " + PEM_BODY + " me@host"),
    (
        "private_key",
        "encrypted",
        pem("ENCRYPTED PRIVATE KEY"),
        PEM_LINES,
        "the PRIVATE KEY goes in ~/.ssh",
    ),
    (
        "private_key",
        "escaped_json",
        json.dumps({"key": pem("PRIVATE KEY")}),
        PEM_LINES,
        json.dumps({"cert": pem("CERTIFICATE")}),
    ),
    (
        "private_key",
        "truncated",
        pem("PRIVATE KEY", end=False),
        PEM_LINES,
        "-----BEGIN PRIVATE NOTE-----",
    ),
    (
        "aws_secret_key",
        "assignment",
        f"aws_secret_access_key = {AWS_KEY}",
        [AWS_KEY],
        f"aws commit {GIT_SHA}",  # 40 hex characters: a git SHA, not a key
    ),
    (
        "aws_secret_key",
        "json",
        f'{{"AccessKeyId": "AKIA0000000000000000", "SecretAccessKey": "{AWS_KEY}"}}',
        [AWS_KEY],
        f"{AWS_KEY}X with aws",  # 41 characters, no context before it
    ),
    (
        "aws_secret_key",
        "env",
        f'AWS_SECRET_ACCESS_KEY="{AWS_KEY}"',
        [AWS_KEY],
        f"the build {AWS_KEY} log",  # 40 characters with no aws / secret context
    ),
    (
        "iban",
        "spaced",
        "DE89 3704 0044 0532 0130 00",
        ["DE89 3704 0044 0532 0130 00"],
        "DE89 3704 0044 0532 0130 01",  # wrong checksum
    ),
    (
        "iban",
        "compact",
        "GB82WEST12345698765432",
        ["GB82WEST12345698765432"],
        "GB82WEST1234569876543",  # one character short for GB
    ),
    (
        "iban",
        "letters_in_bban",
        "NL91 ABNA 0417 1643 00",
        ["NL91 ABNA 0417 1643 00"],
        "ZZ91 ABNA 0417 1643 00",  # no such country
    ),
    ("ssn", "dashes", "078-05-1120", ["078-05-1120"], "000-12-3456"),
    ("ssn", "spaces", "219 09 9999", ["219 09 9999"], "666-12-3456"),
    ("ssn", "context", "SSN: 219099999", ["219099999"], "912-34-5678"),
    ("ssn", "group", "123-45-6789", ["123-45-6789"], "123-00-4567"),
    ("ssn", "serial", "123-45-6780", ["123-45-6780"], "123-45-0000"),
    (
        "secret_assignment",
        "env",
        "password=hunter2hunter2",
        ["hunter2hunter2"],
        "password=abc",  # too short to be a secret
    ),
    (
        "secret_assignment",
        "json",
        '{"client_secret": "Zq8-xv7_Rt5.ww"}',
        ["Zq8-xv7_Rt5.ww"],
        '{"secret_santa": "yes"}',
    ),
    (
        "secret_assignment",
        "escaped_json",
        json.dumps({"arguments": json.dumps({"db_password": "Tr0ub4dor&3x"})}),
        ["Tr0ub4dor&3x"],
        json.dumps({"arguments": json.dumps({"password_hint": "pet"})}),
    ),
    (
        "secret_assignment",
        "double_escaped",
        json.dumps({"raw": json.dumps({"arguments": json.dumps({"password": "Tr0ub4dor&3x"})})}),
        ["Tr0ub4dor&3x"],
        json.dumps({"raw": json.dumps({"arguments": json.dumps({"user": "Tr0ub4dor&3x"})})}),
    ),
    (
        "basic_auth",
        "escaped_json",
        json.dumps(json.dumps({"Authorization": "Basic YWRtaW46b3BlbnNlc2FtZQ=="})),
        ["YWRtaW46b3BlbnNlc2FtZQ=="],
        json.dumps(json.dumps({"Authorization": "Digest realm=x"})),
    ),
    (
        "secret_assignment",
        "gcp_key_id",
        '"private_key_id": "8f2b2a1c9d0e7f6a5b4c3d2e1f0a9b8c7d6e5f4a"',
        ["8f2b2a1c9d0e7f6a5b4c3d2e1f0a9b8c7d6e5f4a"],
        '"type": "service_account"',
    ),
    (
        "secret_assignment",
        "azure_connection_string",
        "DefaultEndpointsProtocol=https;AccountName=acme;AccountKey=q8Zk1W+Yt0/pa3Rn==;"
        "EndpointSuffix=core.windows.net",
        ["q8Zk1W+Yt0/pa3Rn=="],
        "DefaultEndpointsProtocol=https;AccountName=acme;EndpointSuffix=core.windows.net",
    ),
    (
        "url_credentials",
        "postgres",
        "postgres://app:S3cretPw77@db.internal:5432/prod",
        ["S3cretPw77"],
        "https://db.internal:5432/prod",
    ),
    (
        "webhook_url",
        "slack",
        "https://hooks.slack.com/services/T0A1B2C3D/B0E1F2G3H/aBcDeFgHiJkLmNoPqRsTuVwX",
        ["aBcDeFgHiJkLmNoPqRsTuVwX"],
        "https://hooks.slack.com/help",
    ),
    (
        "webhook_url",
        "discord",
        "https://discord.com/api/webhooks/123456789012345678/" + "Ab_9-" * 12,
        ["Ab_9-" * 12],
        "https://discord.com/channels/123",
    ),
    (
        "stripe_key",
        "live",
        "sk_live_4eC39HqLyjWDarjtT1zdp7dc",
        ["4eC39HqLyjWDarjtT1zdp7dc"],
        "pk_live_4eC39HqLyjWDarjtT1zdp7dc",  # publishable keys are public
    ),
    (
        "stripe_key",
        "restricted",
        "rk_test_51HqLyjWDarjtT1zdp7dcAbCd",
        ["51HqLyjWDarjtT1zdp7dcAbCd"],
        "sk_live_short",
    ),
    (
        "api_key",
        "openai",
        "sk-proj-AbCdEfGhIjKlMnOpQrStUv123456",
        ["AbCdEfGhIjKlMnOpQrStUv123456"],
        "sk-short",
    ),
    ("api_key", "aws_id", "AKIAIOSFODNN7EXAMPLE", ["AKIAIOSFODNN7EXAMPLE"], "AKIA-ROLE-NAME"),
    (
        "api_key",
        "github",
        "ghp_" + "a1B2c3D4e5" * 3 + "zz",
        ["a1B2c3D4e5" * 3],
        "ghp_tooShort",
    ),
    ("api_key", "gitlab", "glpat-Xy12_Ab34-Cd56Ef78Gh", ["Xy12_Ab34-Cd56Ef78Gh"], "glpat-x"),
    ("api_key", "npm", "npm_" + "A1b2C3d4E5f6" * 3, ["A1b2C3d4E5f6" * 3], "npm_install"),
    (
        "api_key",
        "google_oauth",
        "GOCSPX-" + "aB3_dE6-gH9" * 2 + "jK2mN5",
        ["aB3_dE6-gH9" * 2],
        "GOCSPX-short",
    ),
    (
        "api_key",
        "sendgrid",
        "SG." + "a" * 22 + "." + "B" * 43,
        ["B" * 43],
        "SG.example",
    ),
    (
        "bearer_token",
        "header",
        "Authorization: Bearer eyJhbGciOiJIUzI1NiJ9abcdefgh",
        ["eyJhbGciOiJIUzI1NiJ9abcdefgh"],
        "the bearer bond",
    ),
    (
        "basic_auth",
        "header",
        "Authorization: Basic " + base64.b64encode(b"admin:opensesame").decode(),
        [base64.b64encode(b"admin:opensesame").decode()],
        "basic authorization rules apply",
    ),
    (
        "jwt",
        "token",
        "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.dozjgNryP4J3jVmNHl0w5N",
        ["eyJzdWIiOiIxMjM0In0.dozjgNryP4J3jVmNHl0w5N"],
        "eyJhbGciOiJIUzI1NiJ9",  # a header alone
    ),
    ("email", "plain", "alice.smith@example.com", ["alice.smith@example.com"], "alice at example"),
    (
        "credit_card",
        "visa",
        "4111 1111 1111 1111",
        ["4111 1111 1111 1111"],
        "4111 1111 1111 1112",  # fails the Luhn check
    ),
    (
        "credit_card",
        "then_more_digits",
        "4111 1111 1111 1111 12",
        ["4111 1111 1111 1111"],
        "4111 1111 1111 1112 9",  # no group boundary gives a Luhn-valid number
    ),
    ("phone", "us", "+1 (415) 555-0133", ["555-0133"], "version 1.2.3, step 17 of 50"),
]


# ----------------------------------------------------------------- hypothesis strategies

_B64 = string.ascii_letters + string.digits + "+/"
_ALNUM = string.ascii_letters + string.digits
_UPPER_DIGITS = string.ascii_uppercase + string.digits
_VALUE = _ALNUM + "!#$%&*+./?^_~-"  # what a password may hold in `key=value` form


def _chars(alphabet: str, size: int, max_size: int | None = None):
    """Random text as secrets are: high entropy (>= 6 distinct characters), so a core cannot
    turn up by chance elsewhere in the store's bytes (`00000000` does, in zarr metadata)."""
    text = st.text(alphabet, min_size=size, max_size=size if max_size is None else max_size)
    return text.filter(lambda t: len(set(t)) >= min(6, len(t)))


def _random_bytes(min_size: int, max_size: int):
    return st.binary(min_size=min_size, max_size=max_size).filter(lambda b: len(set(b)) >= 6)


@st.composite
def private_keys(draw) -> Planted:
    label = draw(st.sampled_from(["RSA ", "EC ", "DSA ", "OPENSSH ", "", "ENCRYPTED "]))
    body = base64.b64encode(draw(_random_bytes(48, 400))).decode()
    lines = [body[i : i + 64] for i in range(0, len(body), 64)]
    newline = draw(st.sampled_from(["\n", "\r\n", "\\n"]))
    text = pem(f"{label}PRIVATE KEY", newline, lines, end=draw(st.booleans()))
    if draw(st.booleans()):  # a GCP service-account file, as a JSON string
        key_id = draw(_chars("0123456789abcdef", 40))
        account = {"type": "service_account", "private_key_id": key_id, "private_key": text}
        text = json.dumps(account)
        return Planted("private_key", text, (*(ln for ln in lines if len(ln) >= 16), key_id))
    return Planted("private_key", text, tuple(ln for ln in lines if len(ln) >= 16))


@st.composite
def aws_secret_keys(draw) -> Planted:
    key = draw(_chars(_B64, 40).filter(lambda k: not all(c in string.hexdigits for c in k)))
    form = draw(
        st.sampled_from(
            [
                "aws_secret_access_key = {}",
                'AWS_SECRET_ACCESS_KEY="{}"',
                '"SecretAccessKey": "{}"',
                "my aws secret key is {}",
                "escaped",
            ]
        )
    )
    if form == "escaped":  # credentials JSON inside a JSON string
        return Planted("aws_secret_key", json.dumps(json.dumps({"SecretAccessKey": key})), (key,))
    return Planted("aws_secret_key", form.format(key), (key,))


@st.composite
def ibans(draw) -> Planted:
    country = draw(st.sampled_from(sorted(IBAN_LENGTHS)))
    bban = draw(_chars(_UPPER_DIGITS, IBAN_LENGTHS[country] - 4))
    check = 98 - iban_mod97(f"{country}00{bban}")
    compact = f"{country}{check:02d}{bban}"
    spaced = " ".join(compact[i : i + 4] for i in range(0, len(compact), 4))
    text = spaced if draw(st.booleans()) else compact
    return Planted("iban", text, (compact, spaced))


@st.composite
def ssns(draw) -> Planted:
    area = draw(st.integers(1, 899).filter(lambda a: a != 666))
    group, serial = draw(st.integers(1, 99)), draw(st.integers(1, 9999))
    number = f"{area:03d}{group:02d}{serial:04d}"
    form = draw(st.sampled_from(["-", " ", "bare"]))
    if form == "bare":
        return Planted("ssn", f"SSN: {number}", (number,))
    text = form.join([number[:3], number[3:5], number[5:]])
    return Planted("ssn", text, (text,))


@st.composite
def secret_assignments(draw) -> Planted:
    value = draw(_chars(_VALUE, 8, 24).filter(lambda v: not v.startswith("-----")))
    name = draw(st.sampled_from(["password", "db_passwd", "api_key", "client_secret", "apiKey"]))
    form = draw(st.sampled_from(["{}={}", "{}: {}", '"{}": "{}"', "escaped"]))
    if form == "escaped":  # tool arguments as the JSON string the OpenAI API sends
        text = json.dumps({"arguments": json.dumps({name: value})})
    else:
        text = form.format(name, value)
    return Planted("secret_assignment", text, (value,))


@st.composite
def cards(draw) -> Planted:
    prefix = draw(st.sampled_from(["4", "51", "37", "6011"]))
    length = 15 if prefix == "37" else 16
    body = prefix + draw(_chars(string.digits, length - len(prefix) - 1))
    check = next(d for d in "0123456789" if luhn_ok(body + d))
    number = body + check
    separator = draw(st.sampled_from(["", " ", "-"]))
    text = separator.join(number[i : i + 4] for i in range(0, len(number), 4))
    return Planted("credit_card", text, (text,))


def _token(kind: str, template: str, core, *parts) -> st.SearchStrategy[Planted]:
    """A fixed-form secret `template.format(core, *parts)` whose core is drawn."""

    def planted(core: str, *parts: str) -> Planted:
        return Planted(kind, template.format(core, *parts), (core,))

    return st.builds(planted, core, *parts)


SECRETS = st.one_of(
    private_keys(),
    aws_secret_keys(),
    ibans(),
    ssns(),
    secret_assignments(),
    cards(),
    _token("url_credentials", "postgres://app:{}@db.internal:5432/prod", _chars(_ALNUM, 8, 20)),
    _token(
        "webhook_url",
        "https://hooks.slack.com/services/T{1}/B{2}/{0}",
        _chars(_ALNUM, 24),
        _chars(_UPPER_DIGITS, 8, 10),
        _chars(_UPPER_DIGITS, 8, 10),
    ),
    _token("stripe_key", "sk_live_{}", _chars(_ALNUM, 24, 40)),
    _token("api_key", "sk-proj-{}", _chars(_ALNUM, 20, 40)),
    _token("api_key", "AKIA{}", _chars(_UPPER_DIGITS, 16)),
    _token("api_key", "ghp_{}", _chars(_ALNUM, 36)),
    _token("api_key", "hf_{}", _chars(_ALNUM, 34)),
    _token("bearer_token", "Authorization: Bearer {}", _chars(_ALNUM + "._~+/-", 20, 40)),
    _token(
        "basic_auth",
        "Authorization: Basic {}",
        _random_bytes(8, 30).map(lambda b: base64.b64encode(b).decode()),
    ),
    _token("jwt", "eyJhbGciOiJIUzI1NiJ9.eyJ{}.{}", _chars(_ALNUM, 10, 30), _chars(_ALNUM, 8, 20)),
    st.from_regex(r"[a-z][a-z0-9._]{2,12}[a-z0-9]@example\.com", fullmatch=True).map(
        lambda address: Planted("email", address, (address,))
    ),
)
