"""The one rule for what is secret, used by every part of rlctl."""

from __future__ import annotations

import re

# THE rule for what is secret, used everywhere (env, --set, backend extras, argv records, sinks' config): a name
# (environment variable, recipe key, command-line flag) whose last word says it holds a credential. Secret values
# are never written to a file rlctl writes, only referenced as ${NAME}.
SECRET_PATTERN = re.compile(
    r"(^|[_.-])(API_?KEY|ACCESS_?KEY|SECRET_?KEY|PRIVATE_?KEY|SIGNING_?KEY|ENCRYPTION_?KEY|KEY|TOKEN|SECRET|"
    r"PASSWORD|PASSWD|PASS|PWD|PASSPHRASE|CREDENTIALS?|AUTH|COOKIE|DSN|WEBHOOK(_?URL)?)$", re.IGNORECASE)
# ...except names of data fields that end in KEY (`input_key`, verl's `prompt_key`): column names, not credentials.
NOT_SECRET = re.compile(
    r"(^|[_.-])(INPUT|LABEL|PROMPT|RESPONSE|REWARD|ANSWER|OUTPUT|CHOSEN|REJECTED|TEXT|IMAGE|VIDEO|AUDIO|QUERY|"
    r"CONTEXT|SORT|METRIC|MONITOR|GROUP|COLUMN|TARGET|DATASET|DATA|MESSAGES?|CONVERSATIONS?|TOOLS?|SYSTEM|CACHE|"
    r"PRIMARY|PARTITION|HASH|LOOKUP|ID|UID|STEP|EVAL|SCORE|DICT|MAP|EXTRA_INFO|GROUND_TRUTH|SOLUTION)_?KEYS?$",
    re.IGNORECASE)


def is_secret_name(name: str) -> bool:
    """True if a value stored under `name` is a secret (see SECRET_PATTERN): `HF_TOKEN`, `env.DB_PASSWORD`,
    `--wandb-api-key`, `hub_token`; not `input_key`."""
    leaf = str(name).lstrip("-").rsplit(".", 1)[-1]
    return bool(SECRET_PATTERN.search(leaf)) and not NOT_SECRET.search(leaf)


# A misspelt credential word (`HF_TOKN`, `WANDB_API_KY`, `DB_PASWORD`) is no secret name by the rule above, so its
# value would be written in plain text: such a name is treated as a secret too, and the user is told its spelling.
_WORDS = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "PASSPHRASE", "CREDENTIAL", "CREDENTIALS")
_KEY_SLIP = re.compile(r"(^|[_.-])(API|ACCESS|SECRET|PRIVATE|SIGNING)[_-]?(K[A-Z]{0,3})$", re.IGNORECASE)
_REAL_WORDS = {"TOKENS", "TAKEN", "SECRETARY"}  # words near a credential word that are no credential (`max_tokens`)


def credential_slip(name: str) -> tuple[str, str] | None:
    """(the misspelt word, the credential word it misspells) when a name's last word is a slip of one
    (`HF_TOKN` → ("TOKN", "TOKEN"), `api_kye` → ("kye", "KEY")); None for a secret name or an ordinary one."""
    import difflib

    leaf = str(name).lstrip("-").rsplit(".", 1)[-1]
    if is_secret_name(leaf) or NOT_SECRET.search(leaf):
        return None
    m = _KEY_SLIP.search(leaf)
    if m:
        return m.group(3), "KEY"
    word = re.split(r"[_.-]", leaf)[-1]
    if len(word) < 3 or word.upper() in _REAL_WORDS:
        return None
    for real in _WORDS:
        w = word.upper()
        if (len(w) >= 4 and real.startswith(w)) or difflib.SequenceMatcher(None, w, real).ratio() >= 0.8:
            return word, real
    return None


def looks_secret(name: str) -> bool:
    """A secret name, or a slip of one (credential_slip): either way its value must not be written."""
    return is_secret_name(name) or credential_slip(name) is not None


def corrected(name: str) -> str:
    """The name with its misspelt credential word spelt right (`HF_TOKN` → `HF_TOKEN`), else the name."""
    slip = credential_slip(name)
    if slip is None:
        return name
    word, real = slip
    return name[: len(name) - len(word)] + (real if word.isupper() else real.lower())


# The variable a library reads its credential from, by a word of the recipe key that names the library (W&B reads
# WANDB_API_KEY, huggingface_hub HF_TOKEN, the OpenAI client OPENAI_API_KEY): the fix names what really is read.
READS = (("wandb", "WANDB_API_KEY"), ("hub", "HF_TOKEN"), ("hf", "HF_TOKEN"), ("huggingface", "HF_TOKEN"),
         ("openai", "OPENAI_API_KEY"), ("anthropic", "ANTHROPIC_API_KEY"))


def env_name_for(dotted: str) -> str:
    """The environment variable a secret recipe key belongs in: the one its library reads where rlctl knows it,
    else the key's own name upper-cased (`reward.environment.args.api_key` → API_KEY)."""
    words = set(re.split(r"[^a-z0-9]+", dotted.lower()))
    for word, var in READS:
        if word in words:
            return var
    return re.sub(r"[^A-Za-z0-9_]", "_", corrected(dotted.rsplit(".", 1)[-1])).upper()
