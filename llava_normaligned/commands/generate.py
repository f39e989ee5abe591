"""The ``generate`` command: answer prompts about images with a checkpoint, in full precision or quantized.

    llava-normaligned generate ./llava-na-3b --image cat.png --prompt "What is in the picture?" --load-in-4bit

Loading (quantization, devices, dtypes, adapters, remote code) is ``llava_normaligned.loading``'s: the options are
``shared.flags``' loading group, read once into a ``LoadOptions``; generation is ``llava_normaligned.generation``'s.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from dataclasses import dataclass

from llava_normaligned.checks import (
    NON_NEGATIVE,
    POSITIVE_COUNT,
    BadInput,
    check_input_file,
    check_numbers,
    check_output_file,
)
from llava_normaligned.loading import LoadOptions, SourceNotFound, check_source

from .shared import CommandParser, arguments_accepted, fail, option
from .shared.flags import LoadingOptions

logger = logging.getLogger(__name__)

# ------------------------------------------------------------------------------------------------------- the CLI


@dataclass(frozen=True, kw_only=True)
class GenerateConfig(LoadingOptions):
    """``generate``'s options: the model, one prompt or a file of them, decoding, and how to load the model."""

    model: str = option(help="folder or Hub repo id of a norm-aligned (or stock) LLaVA checkpoint")
    images: list[str] = option("--image", factory=list, nargs="+", action="extend", metavar="PATH",
                               help="image file(s) for --prompt, in order (repeat the flag or list several)")
    prompt: str | None = option("--prompt", default=None,
                                help="the question; its images go before it in one user turn")
    prompts_file: str | None = option("--prompts-file", default=None, metavar="JSONL",
                                      help='batch mode: one {"prompt": ..., "images": [paths]} per line; relative '
                                      "image paths are taken from the file's folder")
    output: str | None = option("--output", default=None, metavar="JSONL",
                                help="batch mode: where to write the rows with an 'answer' added")
    overwrite: bool = option("--overwrite", default=False, action="store_true",
                             help="batch mode: replace an existing --output and discard the answers of an interrupted "
                             "run (by default a rerun resumes from OUTPUT.partial)")
    batch_size: int = option("--batch-size", type=int, default=8,
                             help="batch mode: prompts per forward (default 8)")
    max_new_tokens: int = option("--max-new-tokens", type=int, default=256,
                                 help="tokens generated at most per answer (default 256)")
    temperature: float = option("--temperature", type=float, default=0.0, help="0 (default): greedy")
    system: str | None = option("--system", default=None, help="optional system message")
    quiet: bool = option("--quiet", default=False, action="store_true",
                         help="do not print what was loaded to stderr")


def make_parser() -> CommandParser:
    return CommandParser(
        config_class=GenerateConfig,
        prog="llava-normaligned generate",
        description="Answer a prompt about images (streamed), or a JSONL file of prompts in batches, with a local "
        "folder or Hub repo, in full precision or 4/8-bit (bitsandbytes).",
    )

@dataclass
class PromptRow:
    """One prompt of the batch mode with its image paths (resolved) and the input row, which is written back."""

    prompt: str
    images: list[str]
    row: dict


def read_prompts_file(path: str) -> list[PromptRow]:
    """Read and check every row (prompt text, image files present and readable) before anything is loaded."""
    from llava_normaligned.generation import check_image_path

    base = os.path.dirname(os.path.abspath(path))
    rows = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{where}: not JSON ({error})") from None
            if not isinstance(row, dict) or not isinstance(row.get("prompt"), str):
                raise ValueError(f'{where}: expected an object with a "prompt" string')
            images = row.get("images", [])
            images = [images] if isinstance(images, str) else images
            if not isinstance(images, list) or not all(isinstance(i, str) for i in images):
                raise ValueError(f'{where}: "images" must be a list of paths')
            images = [i if os.path.isabs(i) else os.path.join(base, i) for i in images]
            for image in images:
                try:
                    check_image_path(image)
                except (FileNotFoundError, ValueError) as error:
                    raise ValueError(f"{where}: {error}") from None
            rows.append(PromptRow(row["prompt"], images, row))
    if not rows:
        raise ValueError(f"{path}: no prompts")
    return rows


# the generation options' ranges, checked before anything loads
NUMBERS = {"max_new_tokens": POSITIVE_COUNT, "batch_size": POSITIVE_COUNT, "temperature": NON_NEGATIVE}


def _check_arguments(args) -> Resume | None:
    """Bad input (``BadInput``, exit 2) found before any loading: missing or unreadable inputs, conflicting modes,
    bad numbers, an output that exists or a partial one that does not belong to this run. Batch mode: the rows and
    the answers so far."""
    from llava_normaligned.generation import check_image_path

    if (args.prompt is None) == (args.prompts_file is None):
        raise BadInput("give either --prompt (one answer, streamed) or --prompts-file (batch mode)")
    check_numbers(args, NUMBERS)
    if args.prompts_file is None:
        if args.output or args.overwrite:
            raise BadInput("--output and --overwrite are for batch mode (--prompts-file)")
        for image in args.images:
            try:
                check_image_path(image)
            except (FileNotFoundError, ValueError) as error:
                raise BadInput(f"--image: {error}") from None
        return None
    if args.images:
        raise BadInput("--image goes with --prompt; in batch mode each row names its images")
    if not args.output:
        raise BadInput("--prompts-file needs --output")
    check_input_file("--prompts-file", args.prompts_file)
    check_output_file("--output", args.output)
    if os.path.exists(args.output) and not args.overwrite:
        raise BadInput(f"--output {args.output} exists; pass --overwrite to replace it")
    try:
        rows = read_prompts_file(args.prompts_file)
        return Resume.start(args, rows)
    except (OSError, ValueError) as error:
        raise BadInput(str(error)) from None


# ------------------------------------------------------------------------------------------------- batch mode


def batch_settings(args) -> dict:
    """What decides the answers of a batch run; a partial output is resumed only under the same settings."""
    keys = (
        "model",
        "revision",
        "quantization",
        "dtype",
        "device",
        "attn_implementation",
        "max_new_tokens",
        "temperature",
        "system",
    )
    return {key: getattr(args, key) for key in keys}


@dataclass
class Resume:
    """The rows of a batch run and the answers already in ``<output>.partial`` from an earlier, interrupted run.

    ``<output>.partial`` holds one answered row per line, in input order; ``<output>.partial.settings.json`` the
    settings it was started with. A rerun with the same prompts and settings keeps the complete lines (a line cut by
    a crash is dropped) and answers the rest; other prompts or settings are refused unless ``--overwrite``."""

    rows: list[PromptRow]
    done: int = 0  # rows answered in the partial file
    keep_bytes: int = 0  # the partial file's length up to the last complete line

    @staticmethod
    def paths(output: str) -> tuple[str, str]:
        return output + ".partial", output + ".partial.settings.json"

    @classmethod
    def start(cls, args, rows: list[PromptRow]) -> Resume:
        partial, settings_path = cls.paths(args.output)
        if args.overwrite or not os.path.exists(partial):
            return cls(rows)
        settings = batch_settings(args)
        try:
            with open(settings_path, encoding="utf-8") as handle:
                before = json.load(handle)
        except (OSError, json.JSONDecodeError):
            raise ValueError(
                f"{partial} exists but its settings file {settings_path} is missing or unreadable: cannot tell whether "
                "it was made with these settings; pass --overwrite to start over"
            ) from None
        changed = {k: (before.get(k), v) for k, v in settings.items() if before.get(k) != v}
        if changed:
            detail = ", ".join(f"{k}: {old!r} then, {new!r} now" for k, (old, new) in changed.items())
            raise ValueError(
                f"{partial} was started with other settings ({detail}); rerun with the same ones to resume, or pass "
                "--overwrite to start over"
            )
        resume = cls(rows)
        with open(partial, "rb") as handle:
            for number, line in enumerate(handle, 1):
                if not line.endswith(b"\n"):
                    break  # cut by a crash while writing: answered again
                if number > len(rows):
                    raise ValueError(
                        f"{partial} holds more answers than {args.prompts_file} has prompts; "
                        "pass --overwrite to start over"
                    )
                resume._check_line(partial, number, line)
                resume.done, resume.keep_bytes = number, resume.keep_bytes + len(line)
        return resume

    def _check_line(self, partial: str, number: int, line: bytes) -> None:
        try:
            answered = json.loads(line)
        except json.JSONDecodeError:
            answered = None
        expected = self.rows[number - 1].row
        if (
            not isinstance(answered, dict)
            or not isinstance(answered.get("answer"), str)
            or {k: v for k, v in answered.items() if k != "answer"}
            != {k: v for k, v in expected.items() if k != "answer"}
        ):
            raise ValueError(
                f"{partial}:{number} is not the answer to row {number} of the prompts file (another prompts file?); "
                "pass --overwrite to start over"
            )


EMPTY_ANSWER = ("the model's answer holds no text: it ended the answer at once (or generated only special tokens), as "
                "an untrained or briefly trained model often does; nothing is wrong with the command")


def _run_batch(model, processor, resume: Resume, args) -> int:
    """Answer the rows not yet answered, batch by batch, appending to ``<output>.partial``, renamed to ``<output>`` at
    the end: a crash leaves the answers so far, which a rerun keeps, and never a file that looks complete. Returns
    how many of this run's answers are empty."""
    from llava_normaligned.generation import generate_batch

    partial, settings_path = Resume.paths(args.output)
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    rows = resume.rows
    if resume.done == 0:
        with open(settings_path, "w", encoding="utf-8") as handle:
            json.dump(batch_settings(args), handle, indent=2)
        open(partial, "wb").close()
    else:
        os.truncate(partial, resume.keep_bytes)  # drop a line cut by a crash
        if not args.quiet:
            print(f"resuming: {resume.done}/{len(rows)} answers already in {partial}", file=sys.stderr)
    empty = 0
    with open(partial, "a", encoding="utf-8") as out:
        for start in range(resume.done, len(rows), args.batch_size):
            chunk = rows[start : start + args.batch_size]
            answers = generate_batch(
                model,
                processor,
                [r.prompt for r in chunk],
                [r.images for r in chunk],
                max_new_tokens=args.max_new_tokens,
                batch_size=args.batch_size,
                temperature=args.temperature,
                system=args.system,
            )
            out.writelines(
                json.dumps({**row.row, "answer": answer}, ensure_ascii=False) + "\n"
                for row, answer in zip(chunk, answers)
            )
            out.flush()
            empty += sum(not answer for answer in answers)
            if not args.quiet:
                print(f"answered {min(start + args.batch_size, len(rows))}/{len(rows)}", file=sys.stderr)
    os.replace(partial, args.output)
    os.remove(settings_path)
    return empty


def main(argv: list[str] | None = None) -> int:
    parser = make_parser()
    args = parser.parse_config(argv)
    try:
        check_source(args.model, revision=args.revision)  # first: a mistyped model fails before anything loads
        options = LoadOptions.from_args(args)
        resume = _check_arguments(args)
    except (SourceNotFound, BadInput) as error:
        return fail("generate", error)
    arguments_accepted()
    try:
        model, processor, report = options.load(return_report=True)
    except SourceNotFound as error:  # a model that is not there: bad input, exit 2
        return fail("generate", error)
    except (ImportError, RuntimeError, ValueError, OSError) as error:
        return fail("generate", error, code=1)
    if not args.quiet:
        print(f"{args.model}: {report.summary()}", file=sys.stderr)
    if resume is not None:
        empty = _run_batch(model, processor, resume, args)
        if not args.quiet:
            print(f"wrote {len(resume.rows)} answers to {args.output}", file=sys.stderr)
        if empty:  # said even with --quiet: an empty "answer" field looks like a broken command
            print(f"{empty} of {len(resume.rows) - resume.done} answers are empty: {EMPTY_ANSWER}", file=sys.stderr)
        return 0
    from llava_normaligned.generation import stream_answer

    answer = stream_answer(
        model,
        processor,
        args.prompt,
        args.images,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        system=args.system,
    )
    if not answer:
        print(f"(empty answer) {EMPTY_ANSWER}", file=sys.stderr)
    return 0
