"""``llava-normaligned pull``: download a checkpoint from the Hub (pickle files excluded) and list the remote code it
holds (``hub_cards.push.pull``).

    llava-normaligned pull me/llava-na-3b [--revision REV] [--local-dir DIR]
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from llava_normaligned.hub_cards.card import package_version
from llava_normaligned.hub_cards.push import PullError, pull
from llava_normaligned.hub_cards.selfcheck import known_tokens, scrub
from llava_normaligned.loading import hub_offline

from .shared import CommandParser, arguments_accepted, fail, option


@dataclass(frozen=True, kw_only=True)
class PullConfig:
    """``pull``'s options: the repo, its revision, where to put it, the token."""

    repo_id: str = option(metavar="NS/NAME", help="the Hub model repo, NAMESPACE/NAME")
    revision: str | None = option("--revision", default=None, help="branch, tag or commit hash (default main)")
    local_dir: str | None = option("--local-dir", default=None, help="download here instead of the Hub cache")
    token: str | None = option("--token", default=None, help="Hub token (default HF_TOKEN or the saved login)")


def make_parser() -> CommandParser:
    return CommandParser(
        config_class=PullConfig,
        prog="llava-normaligned pull",
        description="Download a checkpoint from the Hub (pickle files excluded) and show the remote code it holds.",
    )


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_config(argv)
    if hub_offline():
        return fail("pull", f"{args.repo_id}: HF_HUB_OFFLINE is set, so nothing can be downloaded; unset it to pull")
    arguments_accepted()
    try:
        result = pull(args.repo_id, args.revision, args.local_dir, token=args.token)
    except (PullError, ValueError) as error:
        print(f"llava-normaligned pull: {scrub(str(error), known_tokens(args.token))}", file=sys.stderr)
        return 1
    print(f"{args.repo_id} at commit {result.commit} -> {result.path}")
    for name in result.skipped_pickles:
        print(f"  not downloaded: {name} (pickle)")
    for name, digest, same in result.remote_code:
        note = (f"identical to llava-normaligned {package_version()}'s" if same
                else "NOT the installed package's: review it")
        print(f"  remote code {name} sha256 {digest} ({note})")
    for config_name, auto_class, reference in result.cross_repo_code:
        print(f"  WARNING {config_name}: auto_map[{auto_class!r}] = {reference!r} points into another repo: "
              "trust_remote_code would download and run that repo's code too; review it or do not trust remote code")
    print(f'load it with: from_pretrained("{result.path}", trust_remote_code=True)')
    return 0


__all__ = ["PullConfig", "main", "make_parser"]
