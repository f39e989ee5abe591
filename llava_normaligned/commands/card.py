"""``llava-normaligned card``: the model card (README.md) of a checkpoint folder, rendered from the folder itself
(``hub_cards.card.render_card``). ``push`` takes the same card options (``CardFlags``).

    llava-normaligned card ./llava-na-3b --repo-id me/llava-na-3b --license apache-2.0 --output -
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from llava_normaligned.atomic_files import write_text_atomic
from llava_normaligned.hub_cards.card import (
    BASE_MODEL_RELATIONS,
    CardOptions,
    check_card,
    render_card,
    validate_on_hub,
)
from llava_normaligned.hub_cards.selfcheck import TOKEN_PATTERN, SelfCheckError, check_checkpoint_folder

from .shared import CommandParser, arguments_accepted, fail, option

CARD = "model card"  # the --help section of the card options


@dataclass(frozen=True, kw_only=True)
class CardFlags:
    """The model card's options, shared by ``card`` and ``push`` (read into ``CardOptions`` by ``card_options``)."""

    license: str | None = option("--license", default=None, group=CARD,
                                 help="Hub license id of the weights (e.g. apache-2.0, llama3.2)")
    dataset: list[str] = option("--dataset", factory=list, group=CARD, action="append",
                                help="Hub dataset id trained on (repeatable)")
    base_model: list[str] = option("--base-model", factory=list, group=CARD, action="append",
                                   help="Hub model id of a base model (repeatable; default: the LLM's id in "
                                   "config.json)")
    base_model_relation: str | None = option(
        "--base-model-relation", default=None, group=CARD, choices=BASE_MODEL_RELATIONS,
        help="how the model derives from the base model(s) (default: finetune for a trained checkpoint and the LLM "
        "from config.json; unset for --base-model lists)")
    tag: list[str] = option("--tag", factory=list, group=CARD, action="append", help="extra tag (repeatable)")
    diagnostics: str | None = option("--diagnostics", default=None, group=CARD, metavar="DIR",
                                     help="diagnose output to report (default: DIR/diagnostics)")
    eval: str | None = option("--eval", default=None, group=CARD, metavar="DIR",
                              help="eval output to report (default: DIR/eval)")


def card_options(args: CardFlags, repo_id=None, revision=None, branch=None) -> CardOptions:
    return CardOptions(
        repo_id=repo_id, revision=revision, branch=branch, license=args.license, datasets=tuple(args.dataset),
        base_models=tuple(args.base_model), base_model_relation=args.base_model_relation, tags=tuple(args.tag),
        diagnostics_dir=args.diagnostics, eval_dir=args.eval,
    )


@dataclass(frozen=True, kw_only=True)
class CardConfig(CardFlags):
    """``card``'s options: the folder, where the card goes, what its snippets name, then ``CardFlags``."""

    folder: str = option(help="checkpoint folder (written by compose, convert or train)")
    output: str | None = option("--output", default=None,
                                help="where to write the card (default: FOLDER/README.md; - for stdout)")
    repo_id: str | None = option("--repo-id", default=None, help="NS/NAME the usage snippets load from")
    revision: str | None = option("--revision", default=None, help="commit hash the usage snippets pin")
    validate: bool = option("--validate", default=False, action="store_true",
                            help="also validate the metadata with the Hub's API (HF_ENDPOINT; needs the network)")


def make_parser() -> CommandParser:
    return CommandParser(
        config_class=CardConfig,
        prog="llava-normaligned card",
        description="Render the model card (README.md) of a checkpoint folder from its config, weights and records.",
    )


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_config(argv)
    try:
        check_checkpoint_folder(args.folder)
    except SelfCheckError as error:  # bad input: exit 2, as argparse's own usage errors
        return fail("card", error)
    arguments_accepted()
    try:
        card = render_card(args.folder, card_options(args, args.repo_id, args.revision))
        check_card(card)
    except ValueError as error:
        print(f"llava-normaligned card: {error}", file=sys.stderr)
        return 1
    problem = validate_on_hub(card) if args.validate else None
    if problem is not None:
        print(f"llava-normaligned card: {TOKEN_PATTERN.sub('hf_***', problem)}", file=sys.stderr)
        return 1
    if args.output == "-":
        sys.stdout.write(str(card))
        return 0
    output = Path(args.output) if args.output else Path(args.folder) / "README.md"
    write_text_atomic(output, str(card))  # never a half-written card
    print(f"wrote {output}")
    return 0


__all__ = ["CardConfig", "CardFlags", "card_options", "main", "make_parser"]
