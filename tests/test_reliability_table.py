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
