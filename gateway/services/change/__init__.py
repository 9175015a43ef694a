"""The change path: open and sync proposals, plan, decide, apply under locks, merge, recover."""
