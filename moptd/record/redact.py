"""What `moptd record` takes out of a bundle before it is written: secrets by default, host
names and addresses on request (docs/security.md, "What record redacts").

The convention is sosreport's: `sos report` masks passwords and keys in what it collects by
default (its plugins' ``do_cmd_output_sub``/``do_file_sub``), and `sos clean` (``--clean``,
``--mask``) replaces host names and IP addresses with consistent pseudonyms, so the same host
is the same token in every file (``host0``; IPv4 into a private range). A secret is replaced
by ``[REDACTED]`` in place: the line, the quotes around a value and the option before it stay,
so the parsers replay uses (kernel log, serving logs, Prometheus text, JSON, YAML) read a
redacted file as they read the original, and ``[REDACTED]`` itself never matches again
(redacting twice changes nothing and counts nothing).

Every pattern is data below, with where it comes from. They match option and variable names
whole, never a substring: ``--tokenizer``, ``--tokenizer-mode`` and
``--max-num-batched-tokens`` are not secrets, ``--api-key``, ``--hf-token``, ``--token``,
``--db-password`` and ``HF_TOKEN=`` are.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from moptd.record.mask import HOST_KINDS, HostMasker

MARK = "[REDACTED]"

# The last word of a name that holds a secret. From the names serving stacks actually use:
# vLLM and SGLang `--api-key` (vllm/entrypoints/openai/cli_args.py), `--hf-token` and
# HF_TOKEN / HUGGING_FACE_HUB_TOKEN (huggingface_hub's environment variables), OPENAI_API_KEY,
# AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN (the AWS CLI's), GITHUB_TOKEN; and the words
# sosreport's plugins mask (password, passwd, secret, key, token, credentials).
# A plural ("tokens") is a count, not a secret: --max-num-batched-tokens, max_tokens.
_SECRET_WORD = (
    r"(?:api[-_]?key|apikey|key|token|secret|password|passwd|pwd|passphrase|credentials?)"  # noqa: S105 - names, not a secret
)
SECRET_NAME = rf"(?:[A-Za-z0-9]+[-_])*{_SECRET_WORD}"
_SECRET_NAME_RE = re.compile(rf"{SECRET_NAME}", re.IGNORECASE)
# Names that end in "token" and are not secrets: a tokenizer's special tokens
# (transformers' tokenizer_config.json, printed by vLLM and SGLang at start).
# And names that end in "key" and are a lookup key: TensorRT-LLM's build config
# "cluster_key" (the GPU it was built for, in tests/fixtures/trt-engine), and the usual
# data-structure keys.
NOT_SECRET_NAMES = re.compile(
    r"(?:bos|eos|pad|unk|sep|cls|mask|im[-_]start|im[-_]end|special|chat[-_]template)[-_]token"
    r"|(?:cluster|sort|cache|partition|routing|primary|foreign|hash|shard|group|label)[-_]key",
    re.IGNORECASE,
)
# A number is a count or an id ("token": 428 in a tokenizer.json), not a credential.
_NUMBER = re.compile(r"-?\d{1,9}")
# Values that say no secret is set (argparse's default None, JSON null, an empty string).
EMPTY_VALUES = frozenset({"", "None", "none", "null", "NULL", "''", '""', "[]", MARK})

# A value after a name: quoted (Python repr, JSON), a list (vLLM >= 0.10 logs
# `'api_key': ['...']`, --api-key being repeatable), or a bare word up to the next separator.
# Nothing that str.splitlines() breaks at is ever inside a match: a line stays a line.
_NL = r"\n\r\v\f\x1c-\x1e\x85\u2028\u2029"
_QUOTED = rf"'[^'{_NL}]*'|\"[^\"{_NL}]*\""
_LIST = rf"\[[^\]{_NL}]*\]"
_BARE = r"[^\s'\",;)}\]]+"


@dataclass(frozen=True)
class Rule:
    """One kind of secret: ``value`` is the group that is replaced; the rest is kept."""

    kind: str
    pattern: re.Pattern[str]
    value: str = "value"
    name: str | None = None  # the group holding the name, checked against NOT_SECRET_NAMES
    # every match holds one of these, lower-cased: a line without any is not searched
    needles: tuple[str, ...] = ()


# A name that holds a secret holds one of these (its last word, _SECRET_WORD).
_NAME_NEEDLES = ("key", "token", "secret", "pass", "pwd", "credential")


def _r(pattern: str, flags: int = 0) -> re.Pattern[str]:
    return re.compile(pattern, flags)


RULES: tuple[Rule, ...] = (
    # `--api-key sk-...`, `--hf-token=hf_...`, `--db-password x` on a line of text (a command
    # echoed into a log, dmesg's kernel command line). The value after a space must not be
    # another option. sosreport masks `--password X` in the command lines it collects.
    Rule(
        "option-value",
        _r(
            rf"(?<![\w-])(?P<name>--?{SECRET_NAME})"
            rf"(?:=(?P<v1>{_QUOTED}|{_LIST}|{_BARE})|[ \t]+(?P<v2>{_QUOTED}|{_LIST}|(?!-){_BARE}))",
            re.IGNORECASE,
        ),
        value="v1|v2",
        name="name",
        needles=_NAME_NEEDLES,
    ),
    # `FOO_API_KEY=...` (environment listings, `env` output, systemd's Environment=),
    # `api_key='sk-...'` (vLLM's argparse Namespace repr), `token = "x"` (TOML/INI).
    Rule(
        "assignment",
        _r(
            rf"(?<![\w.-])(?P<name>{SECRET_NAME})"
            rf"(?:=(?P<v1>{_QUOTED}|{_LIST}|{_BARE})|[ \t]*=[ \t]*(?P<v2>{_QUOTED}|{_LIST}))",
            re.IGNORECASE,
        ),
        value="v1|v2",
        name="name",
        needles=_NAME_NEEDLES,
    ),
    # `'api_key': 'sk-...'` (vLLM's "non-default args: {...}" line, vllm#22164),
    # `"token": "..."` (JSON), `HF_TOKEN: hf_...` (YAML at the start of a line).
    Rule(
        "key-value",
        _r(
            rf"(?:(?P<q>['\"])(?P<name>{SECRET_NAME})(?P=q)"
            rf"|^[ \t]*(?:-[ \t]+)?(?P<name2>{SECRET_NAME}))"
            rf"[ \t]*:[ \t]*(?P<value>{_QUOTED}|{_LIST}|{_BARE})",
            re.IGNORECASE | re.MULTILINE,
        ),
        name="name|name2",
        needles=_NAME_NEEDLES,
    ),
    # HTTP authorization: `Authorization: Bearer <token>` (RFC 6750), `Basic <b64>` (RFC 7617),
    # also as a header dict entry; and a bare `Bearer <token>` that holds a digit (prose such as
    # "Bearer authentication" does not).
    Rule(
        "authorization-header",
        _r(
            r"(?<![\w-])authorization['\"]?[ \t]*[:=][ \t]*['\"]?(?:(?:bearer|basic|token)[ \t]+)?"
            r"(?P<value>[^\s'\",]+)",
            re.IGNORECASE,
        ),
        needles=("authorization",),
    ),
    Rule(
        "bearer-token",
        _r(r"(?<![\w-])Bearer[ \t]+(?P<value>(?=[\w.~+/-]*\d)[\w.~+/-]{8,}=*)"),
        needles=("bearer",),
    ),
    # Credentials in a URL (RFC 3986 userinfo: `https://user:pass@host`): the password goes,
    # the user stays (it says which account).
    Rule(
        "url-credentials",
        _r(r"\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s/:@'\"]+:(?P<value>[^\s/@'\"]+)@"),
        needles=("://",),
    ),
    # Token shapes, wherever they appear. The prefixes are gitleaks' (config/gitleaks.toml,
    # rules openai-api-key, huggingface-access-token, github-pat/-oauth/-app-token,
    # github-fine-grained-pat, aws-access-token, slack-*-token, gcp-api-key); the lengths are
    # looser than gitleaks' exact ones (hf_ and 34 letters there, 30 or more letters and
    # digits here): a scanner avoids false alarms, a redactor would rather take one more.
    Rule(
        "openai-key",
        _r(r"\b(?P<value>sk-(?:proj-|ant-|svcacct-)?[A-Za-z0-9_-]{20,})"),
        needles=("sk-",),
    ),
    Rule("huggingface-token", _r(r"\b(?P<value>hf_[A-Za-z0-9]{30,})\b"), needles=("hf_",)),
    Rule(
        "github-token",
        _r(r"\b(?P<value>gh[pousr]_[A-Za-z0-9]{36,}|github_pat_[A-Za-z0-9_]{22,})\b"),
        needles=("gh",),
    ),
    Rule(
        "aws-access-key-id",
        _r(r"\b(?P<value>(?:A3T[A-Z0-9]|AKIA|ASIA|ABIA|ACCA)[0-9A-Z]{16})\b"),
        needles=("a3t", "akia", "asia", "abia", "acca"),
    ),
    Rule("slack-token", _r(r"\b(?P<value>xox[baprs]-[A-Za-z0-9-]{10,})"), needles=("xox",)),
    Rule("google-api-key", _r(r"\b(?P<value>AIza[0-9A-Za-z_-]{35})"), needles=("aiza",)),
)


def _group(m: re.Match[str], names: str | None) -> tuple[str | None, int, int]:
    if names is None:
        return None, -1, -1
    for n in names.split("|"):
        if m.group(n) is not None:
            return m.group(n), m.start(n), m.end(n)
    return None, -1, -1


def _secret_value(value: str) -> bool:
    return value not in EMPTY_VALUES and value[1:-1] != MARK and not _NUMBER.fullmatch(value)


def _argparse_metavar(name: str, value: str) -> bool:
    """argparse's usage text: `[--api-key API_KEY]`, `--hf-token [HF_TOKEN]` (the metavar is
    the option's dest upper-cased), not a value."""
    bare = value.strip("[]")
    return bare == name.lstrip("-").replace("-", "_").upper()


def _apply(rule: Rule, text: str, counts: Counter[str]) -> str:
    def sub(m: re.Match[str]) -> str:
        name, _, _ = _group(m, rule.name)
        value, start, end = _group(m, rule.value)
        if value is None or not _secret_value(value):
            return m.group(0)
        if name is not None and (
            NOT_SECRET_NAMES.fullmatch(name) or _argparse_metavar(name, value)
        ):
            return m.group(0)
        if value[:1] in "'\"" and len(value) >= 2 and value[-1] == value[0]:
            start, end = start + 1, end - 1  # keep the quotes: the line still parses
        counts[rule.kind] += 1
        s = m.start(0)
        whole = m.group(0)
        return whole[: start - s] + MARK + whole[end - s :]

    return rule.pattern.sub(sub, text)


# Every match of every rule holds one of these, lower-cased (the rules never span lines):
# only the lines that do are run through the rules, searched for in a lower-cased copy
# (case-insensitive alternation is ten times slower in `re`), and on such a line only the
# rules whose needles it holds (a 64 MiB vLLM log: about 2 s on the shared CPU test VM).
# "tokens" and "tokenizer" fill a vLLM log and are not names.
TRIGGER = re.compile(
    r"key|token(?![si])|secret|pass|pwd|credential|bearer|authorization|://"
    r"|sk-|hf_|gh[pousr]_|github_pat_|a3t|akia|asia|abia|acca|xox|aiza"
)
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def redact_line(text: str, counts: Counter[str]) -> str:
    """Every rule over ``text`` (the slow path; ``redact_text`` gives the same result)."""
    for rule in RULES:
        text = _apply(rule, text, counts)
    return text


def redact_text(text: str, counts: Counter[str] | None = None) -> str:
    """``text`` with every secret the rules know replaced by MARK; ``counts`` (by kind) grows
    by what was replaced. Never adds or removes a line."""
    c: Counter[str] = Counter() if counts is None else counts
    low = text.lower()
    if len(low) != len(text):  # a character that lower-cases to two: keep the offsets
        low = text.translate(_ASCII_LOWER)
    out: list[str] = []
    pos = 0
    while (m := TRIGGER.search(low, pos)) is not None:
        start = text.rfind("\n", pos, m.start()) + 1 or pos
        end = text.find("\n", m.end())
        end = len(text) if end < 0 else end
        out.append(text[pos:start])
        line, low_line = text[start:end], low[start:end]
        for rule in RULES:
            if any(n in low_line for n in rule.needles):
                line = _apply(rule, line, c)
        out.append(line)
        pos = end
    out.append(text[pos:])
    return "".join(out)


def secret_option(arg: str) -> bool:
    """Whether ``arg`` is an option whose next argument is a secret (``--api-key``)."""
    if not arg.startswith("-") or "=" in arg:
        return False
    name = arg.lstrip("-")
    return bool(_SECRET_NAME_RE.fullmatch(name)) and not NOT_SECRET_NAMES.fullmatch(name)


def redact_argv(argv: Sequence[str], counts: Counter[str] | None = None) -> list[str]:
    """A command line, argument by argument: the argument after ``--api-key`` (and every
    option named like a secret) is MARK, and each argument is redacted as text too
    (``--hf-token=...``, ``HF_TOKEN=...`` before the command, credentials in a URL)."""
    c: Counter[str] = Counter() if counts is None else counts
    out: list[str] = []
    for i, arg in enumerate(argv):
        if i > 0 and secret_option(argv[i - 1]) and not arg.startswith("-") and arg != MARK:
            if arg not in EMPTY_VALUES:
                c["option-value"] += 1
                out.append(MARK)
                continue
        out.append(redact_text(arg, c))
    return out


@dataclass
class Redactor:
    """What one recording takes out, file by file (the counts go into bundle.yaml)."""

    secrets: bool = True
    masker: HostMasker | None = None

    def __post_init__(self) -> None:
        self.files: dict[str, Counter[str]] = {}

    def _counts(self, rel: str) -> Counter[str]:
        return self.files.setdefault(rel, Counter())

    def text(self, rel: str, text: str, addresses: bool = True) -> str:
        c = self._counts(rel)
        if self.secrets:
            text = redact_text(text, c)
        if self.masker is not None:
            text = self.masker.mask(text, c, addresses)
        return text

    def argv(self, rel: str, argv: Sequence[str]) -> list[str]:
        c = self._counts(rel)
        out = redact_argv(argv, c) if self.secrets else list(argv)
        if self.masker is not None:
            out = [self.masker.mask(a, c) for a in out]
        return out

    def host(self, rel: str, name: str) -> str:
        """A host name that stands alone (bundle.yaml's host): its pseudonym when masking."""
        if self.masker is None:
            return name
        masked = self.masker.host(name)
        self._counts(rel)["host-name"] += masked != name
        return masked

    def data(self, rel: str, data: bytes, addresses: bool = True) -> bytes:
        """Bytes as read: decoded so that bytes that are not UTF-8 come back unchanged."""
        if not self.secrets and self.masker is None:
            return data
        text = data.decode("utf-8", "surrogateescape")
        return self.text(rel, text, addresses).encode("utf-8", "surrogateescape")

    def secret_count(self) -> tuple[int, int]:
        """(secrets redacted, files they were in)."""
        per = [sum(v for k, v in c.items() if k not in HOST_KINDS) for c in self.files.values()]
        return sum(per), sum(1 for n in per if n)

    def host_count(self) -> tuple[int, int]:
        per = [sum(c[k] for k in HOST_KINDS) for c in self.files.values()]
        return sum(per), sum(1 for n in per if n)

    def manifest(self) -> dict[str, object]:
        """bundle.yaml's ``redactions``: what was done, and per file the count of each kind
        (never a value)."""
        files = {
            rel: dict(sorted(c.items())) for rel, c in sorted(self.files.items()) if sum(c.values())
        }
        return {
            "secrets": "redacted" if self.secrets else "kept (--no-redact)",
            "hosts": "masked" if self.masker is not None else "kept",
            "marker": MARK,
            "files": files,
        }
