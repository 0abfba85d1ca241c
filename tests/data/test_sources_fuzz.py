"""Property: whatever bytes a user hands the readers, the outcome is a parse or a clear error."""

import csv
import io
import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import read_whole

SETTINGS = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


def outcome(path, fmt):
    try:
        return read_whole(path, fmt, "text", "label")
    except ValueError as err:
        message = str(err)
        assert str(path) in message and "\n" not in message.strip().split("; ")[0]
        return None


@SETTINGS
@given(data=st.binary(max_size=400), fmt=st.sampled_from(["csv", "tsv", "jsonl"]))
def test_random_bytes_parse_or_fail_clearly(tmp_path, data, fmt):
    path = tmp_path / f"f.{fmt}"
    path.write_bytes(data)
    frame = outcome(path, "auto")
    if frame is not None:
        assert list(frame.columns) == ["row", "text", "label"]


cell = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=12)


@SETTINGS
@given(rows=st.lists(st.tuples(cell, cell), min_size=1, max_size=8),
       sep=st.sampled_from([",", "\t"]))
def test_well_formed_delimited_files_round_trip(tmp_path, rows, sep):
    """Anything Python's csv writer produces (quotes, delimiters, newlines inside fields) reads back."""
    buf = io.StringIO(newline="")
    writer = csv.writer(buf, delimiter=sep, lineterminator="\r\n")  # so it quotes bare \r too
    writer.writerow(["text", "label"])
    writer.writerows(rows)
    path = tmp_path / ("f.tsv" if sep == "\t" else "f.csv")
    path.write_text(buf.getvalue(), encoding="utf-8", newline="")
    frame = read_whole(path, "auto", "text", "label")
    got = list(zip(frame["text"], frame["label"].fillna("")))
    assert got == [(text, label.strip()) for text, label in rows]


@SETTINGS
@given(objs=st.lists(st.dictionaries(st.sampled_from(["text", "label", "x"]),
                                     st.one_of(st.text(max_size=5), st.integers(), st.none())),
                     min_size=1, max_size=6))
def test_jsonl_shapes(tmp_path, objs):
    path = tmp_path / "f.jsonl"
    path.write_text("\n".join(json.dumps(o) for o in objs), encoding="utf-8")
    outcome(path, "auto")


plain_text = st.text(alphabet=st.characters(blacklist_categories=("Cs", "Cc", "Zl", "Zp"),
                                            blacklist_characters="\x85"),
                     min_size=1, max_size=12).filter(lambda t: t.strip())
quoted_text = st.builds(lambda a, q, b: a + q + b, plain_text, st.sampled_from(['"', '""', '"x"']),
                        st.text(alphabet='ab "', max_size=4))


@SETTINGS
@given(rows=st.lists(st.tuples(st.sampled_from(["ham", "spam"]),
                               st.one_of(plain_text, quoted_text)), min_size=1, max_size=8))
def test_headerless_tsv_with_plain_quotes_reads_every_row(tmp_path, rows):
    """quoting none reads `label<TAB>text` lines exactly; auto reads every row, or says (in an
    error or a warning) to use none."""
    path = tmp_path / "labelled"
    path.write_text("".join(f"{label}\t{text}\n" for label, text in rows), encoding="utf-8")
    frame = read_whole(path, "auto", 1, 0, header=False, quoting="none")
    assert list(zip(frame["label"], frame["text"])) == rows
    try:
        auto = read_whole(path, "auto", 1, 0, header=False)
    except ValueError as err:
        assert "set prepare.quoting: none" in str(err)
    else:
        assert len(auto) == len(rows) or "set prepare.quoting: none" in auto.attrs["warnings"][0]
