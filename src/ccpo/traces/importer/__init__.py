"""``ccpo traces import``: a table of per-question answers of several models → ``ccpo.trace/v1``.

The table (CSV or JSON Lines, one row per question and model) becomes a trace set without a
new collection, as a **cascade**: models ordered by mean cost per question, each round's
guide the next stronger model (or one named guide), verdict ``yes`` iff guide and base agree
(an ``agree`` ladder), each model paid once per question. Labels are the table's ``correct``
column, or agreement with a reference model. The package, in the order of the data:

- :mod:`.rows`: reading and validating rows (:class:`ImportRow`, :func:`read_table`);
- :mod:`.spill`: the temporary SQLite file that lets the import hold one question at a time;
- :mod:`.cascade`: the round plan (:class:`Cascade`, :func:`plan_cascade`);
- :mod:`.build`: one question's rows → a trace (:func:`build_trace`, :func:`agreement_labels`);
- :mod:`.table`: the import (:func:`open_table`, :class:`TableImport`, :func:`import_table`).

The table format, labels and streaming: docs/import.md.
"""

from ccpo.traces.importer.build import (
    NO_GOLD,
    agreement_labels,
    build_trace,
    import_signals,
    with_text_signals,
)
from ccpo.traces.importer.cascade import Cascade, plan_cascade
from ccpo.traces.importer.rows import (
    OPTIONAL_COLUMNS,
    REQUIRED_COLUMNS,
    ImportRow,
    Located,
    read_table,
)
from ccpo.traces.importer.table import TableImport, import_table, open_table

__all__ = [
    "NO_GOLD",
    "OPTIONAL_COLUMNS",
    "REQUIRED_COLUMNS",
    "Cascade",
    "ImportRow",
    "Located",
    "TableImport",
    "agreement_labels",
    "build_trace",
    "import_signals",
    "import_table",
    "open_table",
    "plan_cascade",
    "read_table",
    "with_text_signals",
]
