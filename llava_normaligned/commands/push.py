"""``llava-normaligned push``: check that a checkpoint folder stands on its own, then upload it with its model card
in one commit (``hub_cards.push.push``; endpoint and token from ``HF_ENDPOINT`` and ``HF_TOKEN``).

    llava-normaligned push ./llava-na-3b --repo-id me/llava-na-3b [--private] [--revision BRANCH] [--dry-run]
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass
from pathlib import Path

from llava_normaligned.hub_cards.card import check_card, render_card
from llava_normaligned.hub_cards.push import PushError, push
from llava_normaligned.hub_cards.selfcheck import (
    LocalPathError,
    SelfCheckError,
    UploadPlan,
    check_checkpoint_folder,
    check_text_paths,
    known_tokens,
    scrub,
    self_check,
)

from .card import CardFlags, card_options
from .shared import CommandParser, arguments_accepted, fail, option


@dataclass(frozen=True, kw_only=True)
class PushConfig(CardFlags):
    """``push``'s options: the folder, the repo and commit, what to upload and check, then ``card``'s ``CardFlags``."""

    folder: str = option(help="checkpoint folder (compose, convert or train output, or a checkpoint-N)")
    repo_id: str = option("--repo-id", required=True, help="NAMESPACE/NAME; created if missing")
    private: bool = option("--private", default=False, action="store_true", help="create the repo private")
    revision: str | None = option("--revision", default=None, metavar="BRANCH",
                                  help="branch to commit to (default main)")
    commit_message: str | None = option(
        "--commit-message", default=None,
        help="the commit's message (default: \"Upload FOLDER with llava-normaligned VERSION\")")
    token: str | None = option("--token", default=None,
                               help="Hub token (default HF_TOKEN or the saved login; prefer those: a flag shows in "
                               "`ps`)")
    include: list[str] = option("--include", factory=list, action="append", metavar="PATTERN",
                                help="also upload files matching PATTERN (repeatable; pickles are never uploaded)")
    skip_load_check: bool = option("--skip-load-check", default=False, action="store_true",
                                   help="skip loading the folder in a fresh process (for models too large to load "
                                   "here)")
    no_pin_card: bool = option("--no-pin-card", default=False, action="store_true",
                               help="do not follow with the README commit that pins the card's snippets to the model "
                               "commit")
    dry_run: bool = option("--dry-run", default=False, action="store_true",
                           help="check and print what would be uploaded; upload nothing")


def make_parser() -> CommandParser:
    return CommandParser(
        config_class=PushConfig,
        prog="llava-normaligned push",
        description="Check that a checkpoint folder stands on its own, then upload it with its model card in one "
        "commit. Endpoint and token come from HF_ENDPOINT and HF_TOKEN (or `hf auth login`).",
    )


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_config(argv)
    options = card_options(args)
    try:
        check_checkpoint_folder(args.folder)
    except SelfCheckError as error:  # bad input: exit 2, as argparse's own usage errors
        return fail("push", error)
    arguments_accepted()
    try:
        if args.dry_run:
            plan = self_check(args.folder, include=tuple(args.include), tokens=known_tokens(args.token),
                              load=not args.skip_load_check)
            card = render_card(plan.folder, dataclasses.replace(options, repo_id=args.repo_id, branch=args.revision))
            check_card(card)
            check_text_paths("README.md (the rendered model card)", str(card))
            print(plan.summary())
            print("  + README.md (rendered model card)\ndry run: nothing uploaded")
            return 0
        result = push(
            args.folder, args.repo_id, private=args.private, revision=args.revision,
            commit_message=args.commit_message, token=args.token, options=options, include=tuple(args.include),
            check_load=not args.skip_load_check, pin_card=not args.no_pin_card,
        )
    except LocalPathError as error:  # the folder's records must be rewritten: bad input, as a missing folder
        return fail("push", scrub(str(error), known_tokens(args.token)))
    except (SelfCheckError, PushError, ValueError) as error:
        print(f"llava-normaligned push: {scrub(str(error), known_tokens(args.token))}", file=sys.stderr)
        return 1
    print(f"pushed {len(result.uploaded)} file(s) to {result.repo_id}@{result.branch}: commit {result.commit}")
    for path in result.deleted:
        print(f"  deleted stale {path}")
    for path, reason in UploadPlan(Path(args.folder), skipped=result.skipped).skipped_summary():
        print(f"  left out {path}: {reason}")
    if result.card_commit:
        print(f"model card pinned to {result.commit} (commit {result.card_commit})")
    print(f'load it with: from_pretrained("{result.repo_id}", revision="{result.commit}", trust_remote_code=True)')
    return 0


__all__ = ["PushConfig", "main", "make_parser"]
