"""push: upload a checkpoint folder to the Hugging Face Hub, with a model card, never unverified."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from surgery.checks.verify import verify
from surgery.core.errors import SurgeryError
from surgery.engine.reader import CARD_NAME
from surgery.hub.model_card import card_for_folder
from surgery.hub.published import published_files
from surgery.hub.timeouts import bound_requests


class PushError(SurgeryError):
    """The Hub refused or could not take the upload."""


def _files(folder: Path) -> list[Path]:
    """Regular files of the folder and its subfolders, except hidden ones and links."""
    return sorted(
        p
        for p in folder.rglob("*")
        if p.is_file()
        and not p.is_symlink()
        and not any(part.startswith(".") for part in p.relative_to(folder).parts)
    )


# A file to upload: its name in the repository and its content (a local file, or bytes).
Upload = tuple[str, Path | bytes]


def _size(content: Path | bytes) -> int:
    return len(content) if isinstance(content, bytes) else content.stat().st_size


def plan_upload(folder: Path, repo_id: str) -> tuple[list[Upload], str | None]:
    """The files to upload, with the public copies of the recipe, mergekit config, training record
    and eval results (`published_files`), and the model card to put in README.md (None: keep the
    folder's)."""
    card = card_for_folder(folder, title=repo_id)
    published = published_files(folder)
    uploads = []
    for path in _files(folder):
        name = path.relative_to(folder).as_posix()
        if not (card is not None and name == CARD_NAME):
            uploads.append((name, published.get(name, path)))
    return uploads, card


def check_repo_id(repo_id: str) -> str:
    """Refuse a repository id the Hub would refuse, before any work is done.

    Raises:
        SurgeryError: naming the rule broken (huggingface_hub's own validator).
    """
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError as error:
        reason = str(error).splitlines()[0]
        raise SurgeryError(f"{repo_id!r} is not a valid Hub repository id: {reason}") from None
    return repo_id


def check_token() -> None:
    """Refuse a push that would fail for want of a token, before anything is said or done
    (huggingface_hub's own lookup: HF_TOKEN, then the token `hf auth login` saved).

    Raises:
        SurgeryError: no token.
    """
    from huggingface_hub import get_token

    if get_token() is None:
        raise SurgeryError("no Hugging Face token: run `hf auth login` or set HF_TOKEN")


def describe_upload(
    files: list[Upload], card: str | None, repo_id: str, private: bool, revision: str | None
) -> str:
    """The one line said before anything is sent: where, how visible, which branch, how much."""
    size = sum(_size(content) for _, content in files) + (len(card.encode()) if card else 0)
    count = len(files) + (card is not None)
    visibility = "private" if private else "public (an existing repository keeps its visibility)"
    return (
        f"pushing {count} files ({size / 1e6:,.1f} MB) to {repo_id}, "
        f"branch {revision or 'main'}, {visibility}"
    )


def _hub_error(error: Exception, repo_id: str) -> PushError:
    from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError

    if isinstance(error, RepositoryNotFoundError):
        return PushError(f"{repo_id}: repository not found, or your token cannot see it")
    status = getattr(getattr(error, "response", None), "status_code", None)
    if isinstance(error, HfHubHTTPError) and status in (401, 403):
        return PushError(f"{repo_id}: not writable with this token (HTTP {status})")
    first_line = str(error).splitlines()[0] if str(error) else type(error).__name__
    return PushError(f"{repo_id}: upload failed ({first_line})")


def push(
    folder: str | Path,
    repo_id: str,
    *,
    private: bool = False,
    revision: str | None = None,
    commit_message: str | None = None,
    dry_run: bool = False,
    echo: Callable[[str], None] = print,
) -> str | None:
    """Verify `folder`, then create `repo_id` if needed and upload the folder in one commit.

    Args:
        folder: a local checkpoint folder.
        repo_id: `org/name` on the Hub (validated before anything else).
        private: create the repository as private (an existing one keeps its visibility).
        revision: a branch to commit to, created from main if missing.
        commit_message: defaults to one naming the operation.
        dry_run: print the files and the model card; send nothing.
        echo: where messages go.

    Returns:
        The commit URL, or None for a dry run.

    Raises:
        SurgeryError: the folder fails verify, or no token.
        PushError: the Hub refused (not found, not writable) or could not be reached.
    """
    check_repo_id(repo_id)
    if not dry_run:
        check_token()
    folder = Path(folder)
    if not folder.is_dir():
        raise SurgeryError(f"{folder}: not a checkpoint folder")
    report = verify(folder)
    if not report.ok:
        raise SurgeryError(f"{folder} fails verify, not pushed: {report.problems[0]}")
    files, card = plan_upload(folder, repo_id)
    echo(
        ("dry run: " if dry_run else "") + describe_upload(files, card, repo_id, private, revision)
    )
    if dry_run:
        for name, content in files:
            echo(f"{_size(content):>14,d}  {name}")
        if card is not None:
            echo(f"{len(card.encode()):>14,d}  {CARD_NAME} (generated):\n\n{card}")
        return None
    return _upload(folder, repo_id, files, card, private, revision, commit_message)


def _upload(folder, repo_id, files, card, private, revision, commit_message) -> str:
    from huggingface_hub import CommitOperationAdd, HfApi

    operations = [
        CommitOperationAdd(name, content if isinstance(content, bytes) else str(content))
        for name, content in files
    ]
    if card is not None:
        operations.append(CommitOperationAdd(CARD_NAME, card.encode()))
    bound_requests()
    api = HfApi()
    try:
        # None, not False, without --private: an organization that defaults to private stays so.
        api.create_repo(repo_id, private=True if private else None, exist_ok=True)
        if revision:
            api.create_branch(repo_id, branch=revision, exist_ok=True)
        info = api.create_commit(
            repo_id,
            operations,
            commit_message=commit_message or f"Upload {folder.name} (checkpoint-surgery)",
            revision=revision,
        )
    except Exception as error:  # huggingface_hub raises many types; all end as one line here
        raise _hub_error(error, repo_id) from error
    return info.commit_url
