"""docs/cli.md's tables of each plug-in's own options and of the metrics are made from the
registries (``unideploy/cli/docs.py``): the page fails here when it no longer says what the code
declares."""

from pathlib import Path

from unideploy.cli.docs import updated

PAGE = Path(__file__).resolve().parents[2] / "docs" / "cli.md"


def test_the_generated_part_of_the_cli_page_is_current():
    page = PAGE.read_text()
    assert updated(page) == page, "regenerate: python -m unideploy.cli.docs"
    assert "| `--int8-variant auto\\|static\\|dynamic\\|symmetric` | `quantize-int8` pass |" in page
    assert "| `--trt-workspace MIB` | `--target gpu` |" in page and "| `coords` |" in page
