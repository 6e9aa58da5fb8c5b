"""nandoctor's consoles print the user's text as it is: no emoji codes turned into pictures."""
from __future__ import annotations

import io

from nandoctor.console import error_line, report_console


def test_a_path_with_a_colon_word_is_printed_as_written(capsys):
    error_line("pyds/ds.py:boom: building the dataset failed")
    assert "pyds/ds.py:boom: building" in capsys.readouterr().err


def test_a_report_line_of_code_keeps_its_colon_words():
    stream = io.StringIO()
    report_console(stream).print('scores = table[":fire:"] / count')
    assert ':fire:' in stream.getvalue()
