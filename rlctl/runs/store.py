"""The checkpoint.sync store: its fsspec filesystem, and the credentials a client reaches it with (what a remote
launch forwards: through the remote process's stdin, never a file or a command line)."""

from __future__ import annotations

import os
from typing import Any

from rlctl.errors import RlctlError

# the credentials a store's client reads from the environment, by URL scheme
STORE_ENV = {
    "s3": ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_DEFAULT_REGION", "AWS_REGION",
           "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_PROFILE"),
    "gs": ("GOOGLE_APPLICATION_CREDENTIALS", "GOOGLE_CLOUD_PROJECT"),
    "gcs": ("GOOGLE_APPLICATION_CREDENTIALS", "GOOGLE_CLOUD_PROJECT"),
    "az": ("AZURE_STORAGE_CONNECTION_STRING", "AZURE_STORAGE_ACCOUNT_NAME", "AZURE_STORAGE_ACCOUNT_KEY",
           "AZURE_STORAGE_SAS_TOKEN"),
    "abfs": ("AZURE_STORAGE_CONNECTION_STRING", "AZURE_STORAGE_ACCOUNT_NAME", "AZURE_STORAGE_ACCOUNT_KEY",
             "AZURE_STORAGE_SAS_TOKEN"),
}


def store_env_names(url: str | None) -> list[str]:
    """The environment variables the store at `url` is reached with that are set here."""
    if not url or "://" not in url:
        return []
    return [n for n in STORE_ENV.get(url.split("://", 1)[0], ()) if n in os.environ]


def store(url: str) -> tuple[Any, str]:
    """The store's fsspec filesystem (credentials and endpoint as of now) and the root path under it."""
    try:
        import fsspec
    except ImportError:
        raise RlctlError("checkpoint.sync needs fsspec (and s3fs for s3://).", hint='pip install fsspec s3fs') from None
    try:
        fs, root = fsspec.core.url_to_fs(url, skip_instance_cache=True)  # credentials/endpoint as of now
    except (ImportError, ValueError) as e:
        raise RlctlError(f"checkpoint.sync = {url!r}: {e}", hint="e.g. pip install s3fs for s3:// URLs") from None
    if hasattr(fs, "auto_mkdir"):  # a directory tree (file://, an NFS mount; smb://): a write makes its parents,
        fs.auto_mkdir = True       # as an object store's keys need none (fsspec's local filesystem makes none)
    return fs, root.rstrip("/")
