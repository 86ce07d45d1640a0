"""The manual (docs/cli.md, linked from the README) documents every flag of `loadgen run`, as the CLI
defines it: its options table is the one OPTION_SPECS makes, row for row."""

import os

from loadgen.options import OPTION_SPECS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OPTIONS_PAGE = os.path.join(ROOT, "docs", "cli.md")
HEADER = "| flag | environment | meaning |\n| --- | --- | --- |\n"


def options_table() -> str:
    """docs/cli.md's options table as OPTION_SPECS makes it: flag and value name, the
    environment variable, and the help (with its default); a '|' in a cell is escaped."""
    rows = []
    for spec in OPTION_SPECS:
        flag = spec.flag + (" " + spec.metavar if spec.metavar else "")
        cells = (f"`{flag}`", f"`{spec.env}`", spec.help)
        rows.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return HEADER + "\n".join(rows)


def test_the_options_table_is_the_one_the_option_specs_make():
    with open(OPTIONS_PAGE, encoding="utf-8") as f:
        text = f.read()
    start = text.index(HEADER)
    table = text[start: text.index("\n\n", start)]
    assert table == options_table(), "docs/cli.md's options table differs from OPTION_SPECS; it should read:\n" + \
        options_table()
