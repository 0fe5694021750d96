"""docs/reliability.md is rendered from the records the tests leave; check the rendering itself."""

from helpers.reliability import render


def test_headline_counts_and_table_cells():
    rows = [
        {
            "kind": "bad input",
            "area": "configs",
            "case": "a|b",
            "observed": "exit 2 | nothing written",
            "test": "tests/test_x.py::test_a[alpha 0]",
            "runs_lost": "0",
        },
        {
            "kind": "fault",
            "area": "tracking",
            "case": "server killed",
            "observed": "synced",
            "test": "tests/test_y.py::test_b",
            "runs_lost": "0",
        },
        {
            "kind": "set-up",
            "area": "tracking",
            "case": "postgres",
            "observed": "ok",
            "test": "tests/test_y.py::test_c",
            "runs_lost": "0",
        },
    ]
    text = render(rows)
    assert "**1 bad inputs tried, 1 faults survived, 0 runs lost** (1 tracking set-ups checked end to end)." in text
    assert "| bad input | a/b | exit 2 \\| nothing written | `tests/test_x.py::test_a[alpha 0]` |" in text
    assert text.index("## configs") < text.index("## tracking")
    lost = render([{**rows[1], "runs_lost": "2"}])
    assert "2 runs lost" in lost


def test_pytest_temporary_folders_are_normalised_so_the_table_is_stable():
    from helpers.reliability import PYTEST_TMP

    text = "error: artifact /tmp/pytest-of-root/pytest-30/audit0/x.json is bad; see /var/t/pytest-of-ci/pytest-7/y"
    assert PYTEST_TMP.sub("<tmp>/", text) == "error: artifact <tmp>/audit0/x.json is bad; see <tmp>/y"
    worker = "error: /tmp/pytest-of-root/pytest-3/popen-gw1/test_bad0/work/outcomes.csv lacks a column"
    assert PYTEST_TMP.sub("<tmp>/", worker) == "error: <tmp>/test_bad0/work/outcomes.csv lacks a column"


def test_observed_text_is_cut_after_normalising_so_the_cut_does_not_move_with_the_tmp_path():
    from helpers.reliability import OBSERVED_LIMIT, observed_cell

    message = "exit 2, nothing written: `artifact {} is bad: " + "word " * 80 + "`"
    cells = {
        observed_cell(message.format(tmp + "a0/x.json"))
        for tmp in ("/tmp/pytest-of-root/pytest-3/popen-gw1/", "/var/folders/very/long/pytest-of-ci/pytest-1234/")
    }
    assert len(cells) == 1, "the same observation must render the same however long the tmp path was"
    (cell,) = cells
    assert len(cell) <= OBSERVED_LIMIT + 3 and cell.endswith(" …`")
    assert cell.startswith("exit 2, nothing written: `artifact <tmp>/a0/x.json is bad: word")
    assert observed_cell("short\n  text") == "short text"
