"""The manual (docs/cli.md, linked from the README) documents every flag of `loadgen run`, as the CLI
defines it."""

import os

from loadgen.options import OPTION_SPECS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OPTIONS_PAGE = os.path.join(ROOT, "docs", "cli.md")


def test_every_run_flag_is_in_the_options_table_with_its_help():
    with open(OPTIONS_PAGE, encoding="utf-8") as f:
        text = f.read()
    table = text[text.index("| flag | environment | meaning |"):]
    table = table[: table.index("\n\n")]
    for spec in OPTION_SPECS:
        row = next((line for line in table.splitlines()  # "--output" is not "--output-tokens"
                    if line.startswith((f"| `{spec.flag}`", f"| `{spec.flag} "))), None)
        assert row is not None, f"{spec.flag} is not in the options table of docs/cli.md"
        assert f"`{spec.env}`" in row and spec.help.replace("|", "/") in row, row
