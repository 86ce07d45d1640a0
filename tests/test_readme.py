"""The README documents every flag of `loadgen run`, as the CLI defines it."""

import os

from loadgen.options import OPTION_SPECS

README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")


def test_every_run_flag_is_in_the_readme_options_table_with_its_help():
    with open(README, encoding="utf-8") as f:
        text = f.read()
    table = text[text.index("| flag | environment | meaning |"):]
    table = table[: table.index("\n\n")]
    for spec in OPTION_SPECS:
        row = next((line for line in table.splitlines()  # "--output" is not "--output-tokens"
                    if line.startswith((f"| `{spec.flag}`", f"| `{spec.flag} "))), None)
        assert row is not None, f"{spec.flag} is not in the README's options table"
        assert f"`{spec.env}`" in row and spec.help.replace("|", "/") in row, row
