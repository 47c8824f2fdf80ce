"""The catalogue of built-in secret and personal-data detectors used by `atdp_io.redaction`.

Each `Detector` is a regular expression plus what the redactor needs to run it fast and
precisely: the literals every match contains (checked with C-speed substring tests before any
regex runs, so clean text costs a few `in` tests), an optional validator (Luhn, ISO 13616
mod-97) that turns a shape into a finding, and an optional value group so that only the secret
is replaced and its context (`password=`, `aws_secret_access_key = "`) stays readable.

Order matters: all detectors are compiled into one alternation; at one position the first
listed wins, and the leftmost match always wins. The docs (`docs/atdp_io.md`, Redaction) carry
the same table; a test keeps the two in step.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable

VALUE_GROUP_PREFIX = "_v_"  # user detector names start with a letter, so never collide


@dataclasses.dataclass(frozen=True)
class Detector:
    """One built-in detector.

    Attributes:
      name: the finding's name, written as `[REDACTED:<name>]`.
      pattern: the regular expression (flags scoped inline: it is one group of an alternation).
        A group named `_v_<name>` marks the part to replace; without it the whole match goes.
      rule: one line for the docs table: what it catches and how it decides.
      triggers: case-sensitive literals, one of which every match contains.
      lower_triggers: literals one of which every lower-cased match contains.
      shaped: every match contains a run one of the shape pre-filters (`SHAPES`) finds, instead
        of a literal.
      validate: called with the replaced text, returns how many of its leading characters are
        the finding: 0 leaves the match as it was; fewer than all (whole-match detectors only)
        replaces that prefix and scans the rest again.
    """

    name: str
    pattern: str
    rule: str
    triggers: tuple[str, ...] = ()
    lower_triggers: tuple[str, ...] = ()
    shaped: bool = False
    validate: Callable[[str], int] | None = None

    @property
    def value_group(self) -> str | None:
        group = VALUE_GROUP_PREFIX + self.name
        return group if f"(?P<{group}>" in self.pattern else None


def luhn_ok(digits: str) -> bool:
    """The Luhn check of payment-card numbers (`digits` holds only 0-9)."""
    total = 0
    for i, char in enumerate(reversed(digits)):
        d = int(char)
        if i % 2 == 1:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


def card_prefix(text: str) -> int:
    """The longest prefix of a digit-group run that is a card number (13-19 digits, Luhn), as a
    length (0: none). Tried at group boundaries only, so a card followed by more digits
    (`4111 1111 1111 1111 12`) is still found while a near miss stays whole."""
    ends = [m.end() for m in re.finditer(r"\d+", text)]
    for end in reversed(ends):
        digits = re.sub(r"\D", "", text[:end])
        if 13 <= len(digits) <= 19 and luhn_ok(digits):
            return end
    return 0


# Total IBAN length per country, from the SWIFT IBAN registry (ISO 13616).
IBAN_LENGTHS: dict[str, int] = {
    "AD": 24, "AE": 23, "AL": 28, "AT": 20, "AZ": 28, "BA": 20, "BE": 16, "BG": 22, "BH": 22,
    "BI": 27, "BR": 29, "BY": 28, "CH": 21, "CR": 22, "CY": 28, "CZ": 24, "DE": 22, "DJ": 27,
    "DK": 18, "DO": 28, "EE": 20, "EG": 29, "ES": 24, "FI": 18, "FK": 18, "FO": 18, "FR": 27,
    "GB": 22, "GE": 22, "GI": 23, "GL": 18, "GR": 27, "GT": 28, "HN": 28, "HR": 21, "HU": 28,
    "IE": 22, "IL": 23, "IQ": 23, "IS": 26, "IT": 27, "JO": 30, "KW": 30, "KZ": 20, "LB": 28,
    "LC": 32, "LI": 21, "LT": 20, "LU": 20, "LV": 21, "LY": 25, "MC": 27, "MD": 24, "ME": 22,
    "MK": 19, "MN": 20, "MR": 27, "MT": 31, "MU": 30, "NI": 28, "NL": 18, "NO": 15, "OM": 23,
    "PK": 24, "PL": 28, "PS": 29, "PT": 25, "QA": 29, "RO": 24, "RS": 22, "RU": 33, "SA": 24,
    "SC": 31, "SD": 18, "SE": 24, "SI": 19, "SK": 24, "SM": 27, "SO": 23, "ST": 25, "SV": 28,
    "TL": 23, "TN": 24, "TR": 26, "UA": 29, "VA": 22, "VG": 24, "XK": 20, "YE": 30,
}  # fmt: skip


def iban_mod97(compact: str) -> int:
    """ISO 7064 mod 97-10 of an IBAN (no spaces): 1 for a valid one."""
    rearranged = compact[4:] + compact[:4]
    return int("".join(str(int(char, 36)) for char in rearranged)) % 97


def iban_ok(text: str) -> bool:
    compact = re.sub(r"\s", "", text).upper()
    return IBAN_LENGTHS.get(compact[:2]) == len(compact) and iban_mod97(compact) == 1


def _iban_found(text: str) -> int:
    return len(text) if iban_ok(text) else 0


def _iban_pattern() -> str:
    """Country code, check digits, then exactly the country's BBAN length (spaces optional)."""
    by_length: dict[int, list[str]] = {}
    for country, length in IBAN_LENGTHS.items():
        by_length.setdefault(length - 4, []).append(country)
    # Opens with two capitals, so `re` skips ahead in C; look-behinds then check that nothing
    # alphanumeric precedes them and pick the BBAN length from the country.
    lengths = "|".join(
        f"(?<=(?:{'|'.join(countries)})\\d\\d)(?: ?[A-Z0-9]){{{bban}}}"
        for bban, countries in sorted(by_length.items(), reverse=True)
    )
    return f"[A-Z][A-Z](?<![A-Za-z0-9][A-Z][A-Z])\\d\\d(?:{lengths})(?![A-Za-z0-9])"


# Key names (lower-cased, separators dropped) whose string value is a secret, whatever it
# looks like: `{"password": "..."}` in tool arguments, `"client_secret": "..."` in a config.
SECRET_KEY = re.compile(
    r"[a-z0-9]*(?:password|passwd|passphrase|secret|secretkey|apikey|apitoken|accesskey|"
    r"accesstoken|refreshtoken|authtoken|sessiontoken|bearertoken|idtoken|privatekey|"
    r"privatekeyid|accountkey|authorization|credentials?)"
)
# Lower-cased literals one of which every such key holds before its separators are dropped
# ("pass", not "passw": `pass_word` is a password key too).
SECRET_KEY_TRIGGERS = (
    "pass", "secret", "api", "access", "private", "account", "token", "authorization",
    "credential",
)  # fmt: skip
_KEY_SEPARATORS = re.compile(r"[\s_.-]")


def is_secret_key(key: str) -> bool:
    """True when a mapping key names a secret (`aws_secret_access_key`, `clientSecret`)."""
    return SECRET_KEY.fullmatch(_KEY_SEPARATORS.sub("", key).lower()) is not None


# Secret-like names in `name=value` text. Each alternative opens with a case-insensitive letter
# class and only then switches to (?i:...): `re` skips ahead in C on a class, not on (?i:...),
# which makes this 3x faster on prose than one case-insensitive alternation.
_KEYWORDS = (
    r"(?:[Aa](?i:pi[_-]?key|ccess[_-]?(?:token|key)|uth[_-]?token|ccount[_-]?key)"
    r"|[Ss](?i:ecret|ession[_-]?token)|[Pp](?i:ass(?:w(?:or)?d|phrase)|rivate[_-]?key)"
    r"|[Rr](?i:efresh[_-]?token))"
)
_PEM_LABEL = r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----"
_PEM_END = r"-----END [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----"

CATALOGUE: tuple[Detector, ...] = (
    Detector(
        "private_key",
        # Lazy to the first END; a block cut short (max_tokens) goes to the end of its body:
        # base64, newlines (real or escaped) and the headers of encrypted PKCS#1 blocks.
        rf"{_PEM_LABEL}(?:(?s:.*?){_PEM_END}"
        r"|(?:[A-Za-z0-9+/=:,\r\n]|\\+[nrt]|Proc-Type: |DEK-Info: )*)",
        "PEM private-key blocks (PKCS#1 RSA, EC, DSA, OpenSSH, PKCS#8, encrypted, PGP), "
        "`BEGIN` to `END` over real or JSON-escaped (`\\n`) newlines; truncated blocks to the "
        "end of their base64 body",
        triggers=("PRIVATE KEY",),
    ),
    Detector(
        "url_credentials",
        # Opens with the literal `://` (fast to find); the scheme before it is only checked.
        rf"://(?<=[A-Za-z0-9]://)[^\s:/@]+:(?P<{VALUE_GROUP_PREFIX}url_credentials>[^\s/@]+)@",
        "the password of `scheme://user:password@host` (databases, brokers, git remotes)",
        triggers=("://",),
    ),
    Detector(
        "webhook_url",
        r"https://(?:hooks\.slack\.com/(?:services|workflows|triggers)/[A-Za-z0-9/_-]{20,}"
        r"|(?:discord|discordapp)\.com/api/webhooks/\d+/[A-Za-z0-9_-]{20,})",
        "Slack incoming-webhook and Discord webhook URLs (the URL is the credential)",
        triggers=("hooks.slack.com", "/api/webhooks/"),
    ),
    Detector(
        "stripe_key",
        r"[sr]k_(?<!\w[sr]k_)(?:live|test)_[0-9A-Za-z]{16,}",
        "Stripe secret and restricted keys `sk_live_` / `rk_test_` ... (publishable `pk_` keys "
        "are public)",
        triggers=("k_live_", "k_test_"),
    ),
    Detector(
        "aws_secret_key",
        # 40 base64 characters, bounded, next to an aws / secret context of letters only (a
        # context that can hold no other finding: it is kept in the text).
        rf"(?:[Aa](?i:ws)|[Ss](?i:ecret))[A-Za-z_ -]{{0,30}}?(?:\\*[\"'])?\s*[:=]?\s*(?:\\*[\"'])?(?<![A-Za-z0-9/+])"
        rf"(?![0-9a-fA-F]{{40}}(?![A-Za-z0-9/+=]))"
        rf"(?P<{VALUE_GROUP_PREFIX}aws_secret_key>[A-Za-z0-9/+]{{40}})(?![A-Za-z0-9/+=])",
        "AWS secret access keys: 40 base64 characters (not all hex, so no git SHA) within 30 "
        'letters after `aws` or `secret` (`aws_secret_access_key=`, `"SecretAccessKey": `)',
        lower_triggers=("aws", "secret"),
    ),
    Detector(
        "api_key",
        r"\b(?:sk-(?:ant-|proj-)?[A-Za-z0-9_-]{16,}|(?:AKIA|ASIA)[0-9A-Z]{16}"
        r"|gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{40,}|glpat-[A-Za-z0-9_-]{20,}"
        r"|xox[abprs]-[A-Za-z0-9-]{10,}|xapp-[A-Za-z0-9-]{10,}|AIza[0-9A-Za-z_-]{35}"
        r"|GOCSPX-[A-Za-z0-9_-]{28}|hf_[A-Za-z0-9]{30,}|npm_[A-Za-z0-9]{36}"
        r"|pypi-AgEIcHlwaS5vcmc[A-Za-z0-9_-]{50,}|SG\.[A-Za-z0-9_-]{22}\.[A-Za-z0-9_-]{43})",
        "provider keys by prefix: OpenAI / Anthropic `sk-`, AWS access key ids `AKIA` / `ASIA`, "
        "GitHub `ghp_` ... `github_pat_`, GitLab `glpat-`, Slack `xox?-` / `xapp-`, Google "
        "`AIza` and OAuth `GOCSPX-`, Hugging Face `hf_`, npm `npm_`, PyPI, SendGrid `SG.`",
        triggers=(
            "sk-",
            "AKIA",
            "ASIA",
            "ghp_",
            "gho_",
            "ghu_",
            "ghs_",
            "ghr_",
            "github_pat_",
            "glpat-",
            "xox",
            "xapp-",
            "AIza",
            "GOCSPX-",
            "hf_",
            "npm_",
            "pypi-",
            "SG.",
        ),
    ),
    Detector(
        "bearer_token",
        r"[Bb](?<!\w[Bb])(?i:earer)\s+[A-Za-z0-9._~+/=-]{8,}",
        "`Bearer <token>` (HTTP authorization)",
        lower_triggers=("bearer",),
    ),
    Detector(
        "basic_auth",
        rf"[Aa](?i:uthorization)(?:\\*[\"'])?\s*[:=]\s*(?:\\*[\"'])?(?i:basic)\s+"
        rf"(?P<{VALUE_GROUP_PREFIX}basic_auth>[A-Za-z0-9+/]{{8,}}={{0,2}})",
        "`Authorization: Basic <base64>` (the base64 `user:password`)",
        lower_triggers=("authorization",),
    ),
    Detector(
        "jwt",
        r"\beyJ[A-Za-z0-9_-]{6,}\.[A-Za-z0-9_-]{6,}\.[A-Za-z0-9_-]{6,}",
        "JSON web tokens: three base64url parts, the first `eyJ`",
        triggers=("eyJ",),
    ),
    Detector(
        "secret_assignment",
        rf"{_KEYWORDS}[\w.-]*(?:\\*[\"'])?\s*[:=]\s*(?:\\*[\"'])?(?!-----)"
        rf"(?P<{VALUE_GROUP_PREFIX}secret_assignment>[^\s'\",;\\]{{6,}})",
        "the value (6+ characters) after a secret-like name and `:` or `=` (`password=`, "
        '`"client_secret": "`, escaped quotes inside JSON strings); in JSON objects every '
        "string under a secret-like key (`password`, `api_key`, `private_key_id`, `token`-ish)",
        lower_triggers=(
            "api",
            "secret",
            "passw",
            "passphrase",
            "token",
            "private",
            "access",
            "account",
        ),
    ),
    Detector(
        "email",
        r"\b[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}\b",
        "e-mail addresses",
        triggers=("@",),
    ),
    Detector(
        "iban",
        _iban_pattern(),
        "IBANs (ISO 13616), upper case as printed: a registry country code, 2 check digits and "
        "exactly that country's length, with or without spaces, mod-97 checked",
        shaped=True,
        validate=_iban_found,
    ),
    Detector(
        "ssn",
        # Opens with a digit (fast skipping in `re`); the look-behinds then check what precedes
        # the number and the area (never 000, 666 or 9xx).
        r"[0-8](?<![\d-][0-8])\d\d(?<!000)(?<!666)(?P<_ssn_sep>[- ])(?!00)\d\d(?P=_ssn_sep)"
        r"(?!0000)\d{4}(?![\d-])"
        r"|[Ss](?<![A-Za-z0-9][Ss])(?i:sn|ocial\s+security(?:\s+(?:number|no\.?))?)\s*(?:#|:|=|is)?\s*"
        r"(?!000|666|9\d\d)\d{3}(?!00)\d{2}(?!0000)\d{4}\b",
        "US social security numbers `AAA-GG-SSSS` (or spaces; 9 bare digits after `SSN` / "
        "`social security`), never area 000, 666 or 9xx, group 00 or serial 0000",
        shaped=True,
    ),
    Detector(
        "credit_card",
        r"\d(?<![\d-]\d)(?:[ -]?\d){12,18}(?![\d-])",
        "payment-card numbers: 13-19 digits (spaces or dashes between), Luhn checked; a run of "
        "digit groups is tried at each group boundary, longest first",
        shaped=True,
        validate=card_prefix,
    ),
    Detector(
        "phone",
        r"(?<![\w+])(?:\+\d{1,3}[\s.-]?)?(?:\(\d{2,4}\)[\s.-]?|\d{2,4}[\s.-])\d{3,4}[\s.-]?\d{3,4}"
        r"(?!\w)",
        "phone numbers: optional `+country`, an area code (bracketed or separated), 6-8 more "
        "digits",
        shaped=True,
    ),
)

# The shape pre-filters of the `shaped` detectors, tried after the literals: a digit run of >= 9
# characters starting with a digit, "(" or "+" (phones, cards, SSNs), or an upper-case letter
# pair then two digits (the head of an IBAN, whose BBAN may hold letters). Written without
# look-behinds, which would stop `re` from skipping ahead in C.
SHAPES = (re.compile(r"[\d(+][\d\s().+-]{8,}"), re.compile(r"[A-Z][A-Z]\d\d"))


def by_name() -> dict[str, Detector]:
    return {d.name: d for d in CATALOGUE}
