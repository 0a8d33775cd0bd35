"""Result files, tables, plots and reports, drawn from the harness's result rows.

- :mod:`~ccpo.report.tables`: the paper-style table (:class:`~ccpo.report.tables.TableData`)
  and the rules every table shares (the target, noise, the cheapest row, the saving);
- :mod:`~ccpo.report.document`: the one renderer, a document written as Markdown and HTML at
  once (:class:`~ccpo.report.document.Doc`);
- :mod:`~ccpo.report.results`: results.json / .md / .csv of ``evaluate`` and ``compare``,
  written all or none (:func:`~ccpo.report.results.staged_folder`);
- :mod:`~ccpo.report.plots`: box plots, training curves, the cost-vs-coverage frontier;
- :mod:`~ccpo.report.reproduce`: the ``reproduce`` report (report.md and report.html).
"""
