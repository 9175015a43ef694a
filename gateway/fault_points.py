"""Named fault points: a way for tests to kill the process at an exact step, as `kill -9` would.

Every step that must survive a crash names itself with `reach("apply.before_merge")`. When the
environment variable GATEWAY_FAULT_POINT names that point, the process ends there and then, with
no cleanup, no `finally` and no flushing: exactly what a killed worker leaves behind. Points that
repeat per stack carry it after a colon (`apply.after_engine:app-staging`). Unset, `reach` costs
one dictionary lookup.

    apply.after_lock             the locks are held; the proposal has not started applying
    apply.after_start_apply      the proposal is `applying`; no stack's apply has started
    apply.after_engine:STACK     the engine applied STACK; its apply record still says running
    apply.after_stack:STACK      STACK's apply is recorded as succeeded; the next stack has not started
    apply.before_merge           every stack is applied and recorded; the branch is not merged
    apply.after_merge            main has the merge; the proposal is still `applying`
    apply.after_finish           the proposal is recorded applied; its locks are not released yet
    plan.after_stack:STACK       the engine planned STACK for its plan round; the round does not hold the plan
                                 yet (the stack still says planning, its job running)
    add_repository.after_create  `gateway repos add NAME` made the bare repository (main's first commit, the
                                 sample's secrets); it is not registered: adding NAME again begins it anew
"""

from __future__ import annotations

import os
import sys

ENVIRONMENT_VARIABLE = "GATEWAY_FAULT_POINT"
EXIT_STATUS = 137  # what a shell reports for a process killed by SIGKILL


def reach(point: str) -> None:
    """End the process at once if GATEWAY_FAULT_POINT names `point`."""
    if os.environ.get(ENVIRONMENT_VARIABLE) == point:
        sys.stderr.write(f"fault point {point} reached: exiting as if killed\n")
        sys.stderr.flush()
        os._exit(EXIT_STATUS)
