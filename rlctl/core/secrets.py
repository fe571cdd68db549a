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
