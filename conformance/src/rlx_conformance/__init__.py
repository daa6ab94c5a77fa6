"""rlx-conformance: the shared suite that certifies an RLX backend plugin.

    rlx conformance cpu --json cert.json --markdown cert.md
    pytest -p rlx_conformance --rlx-backend cpu

A check is ``passed``, ``failed``, ``error``, ``skipped`` (the backend cannot compile that
variant: *not certified* for it, never passed), ``xfailed`` (listed in the plugin's
``conformance-xfails.txt`` with a reason) or ``xpassed`` (listed but passing: the manifest is
stale, which blocks certification until it is corrected).

The public API, for backend authors and their tests (everything else here is private):

* the suite: :func:`run_suite`, :class:`Outcome`, :data:`SUITE_VERSION`;
* op cases (:mod:`rlx_conformance.cases`): :func:`cases_for` / :func:`all_cases` / :func:`hir_cases`
  generate :class:`OpCase` objects from the op schemas (``OpSchema.cases`` and ``accuracy``);
  :func:`build_case_graph` makes a case's one-node graph; :func:`run_case` compiles and runs it on a
  session and returns a :class:`CaseResult`; :func:`tolerance`, :func:`compare` and
  :func:`accumulation` define what "correct" means;
* model graphs: :mod:`graphs <rlx_conformance.graphs>` (``graphs.graph_cases()``, ``graphs.check_graph``).
"""

__version__ = "0.1.0"
SUITE_VERSION = "1.0"

from . import graphs  # noqa: E402
from .cases import (  # noqa: E402
    CaseResult,
    OpCase,
    accumulation,
    all_cases,
    build_case_graph,
    cases_for,
    compare,
    hir_cases,
    run_case,
    tolerance,
)
from .runner import Outcome, run_suite  # noqa: E402

__all__ = ["SUITE_VERSION", "CaseResult", "OpCase", "Outcome", "__version__", "accumulation", "all_cases",
           "build_case_graph", "cases_for", "compare", "graphs", "hir_cases", "run_case", "run_suite",
           "tolerance"]
